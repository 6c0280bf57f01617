"""Per-example clipping of transformers against a one-example-at-a-time oracle.

Models: Hugging Face's GPT-2 (``GPT2LMHeadModel``: Conv1D projections, LayerNorm, position
embeddings looked up once for the batch, ``lm_head`` tied to ``wte``) and BERT
(``BertForSequenceClassification``, and ``BertForMaskedLM`` whose decoder is tied to the word
embeddings), all tiny and randomly initialised, and ``torch.nn.TransformerEncoder``
(``nn.MultiheadAttention``, with a padding mask, and with a causal (T, T) mask), with padding /
attention masks and dropout off (p = 0); then single layers (Conv1D, LayerNorm, RMSNorm, other
ties, attention with other key/value sizes), attention dropout, and the refusals. The oracle runs each example alone through an untouched copy of the model
with plain autograd, takes the gradient of every trainable parameter (a tied parameter's
gradient is the sum of both uses, as autograd gives it), its norm, clips it and sums in float64.

Tolerances: in float64 the per-example norms must agree to 1e-12 relative and the clipped sums
to 1e-12 of their largest entry (the mathematics is exact: the measured gaps are below 1e-15);
in float32 both to 1e-5 (the batched forward/backward rounds differently from the one-example
one: the measured gaps are below 1e-7 for the norms and 4e-7 for the sums). The clip C is the
median oracle norm (half the examples clipped), then 1e6 (none). Deterministic: fixed seeds, no
noise involved.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import dpkit.torch._units.matmul as matmul  # noqa: E402
import dpkit.torch.per_example as per_example  # noqa: E402
from dpkit.errors import InvalidDataError, InvalidParameterError  # noqa: E402
from dpkit.torch import make_private  # noqa: E402
from dpkit.torch._units.matmul import uses_ghost_norm  # noqa: E402

B, T, VOCAB = 6, 10, 100
TOL = {torch.float64: dict(norm=1e-12, sum=1e-12), torch.float32: dict(norm=1e-5, sum=1e-5)}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest.py)


@pytest.fixture(autouse=True)
def _quiet_transformers():
    transformers.logging.set_verbosity_error()
    yield


# -- models and their per-example losses -------------------------------------------------------------


def gpt2() -> nn.Module:
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg)


def bert() -> nn.Module:
    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=32, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return transformers.BertForSequenceClassification(cfg)


def bert_mlm() -> nn.Module:
    """BertForMaskedLM: its decoder is tied to the word embeddings, inside a prediction head that
    owns a parameter itself (so a torch.func unit shares the weight with an Embedding unit)."""
    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return transformers.BertForMaskedLM(cfg)


class Encoder(nn.Module):
    """Embedding → nn.TransformerEncoder (2 layers; self_attn is nn.MultiheadAttention) → head."""

    def __init__(self, dropout: float = 0.0, causal: bool = False, d: int = 16) -> None:
        super().__init__()
        self.causal = causal
        self.emb = nn.Embedding(VOCAB, d)
        layer = nn.TransformerEncoderLayer(d, nhead=2, dim_feedforward=32, dropout=dropout, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 3)

    def forward(self, ids, pad):
        t = ids.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1) if self.causal else None
        h = self.enc(self.emb(ids), mask=mask, src_key_padding_mask=pad, is_causal=self.causal)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1))


class FeatureEncoder(nn.Module):
    """nn.TransformerEncoder as the first layer, on float features that do not require grad: in
    eval mode it would turn the padded batch into a nested tensor (its inference fast path)."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, nhead=2, dim_feedforward=16, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, num_layers=2)  # enable_nested_tensor=True
        self.head = nn.Linear(8, 3)

    def forward(self, x, pad):
        h = self.enc(x, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1))


def lm_losses(model, ids, mask):
    """Next-token cross-entropy, averaged over each example's own tokens (not over the batch's:
    that would make an example's gradient depend on the others' lengths)."""
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    per_token = nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    valid = mask[:, 1:].to(per_token.dtype)
    return (per_token * valid).sum(1) / valid.sum(1)


def mlm_losses(model, ids, mask):
    logits = model(input_ids=ids, attention_mask=mask).logits
    per_token = nn.functional.cross_entropy(logits.transpose(1, 2), ids, reduction="none")
    valid = mask.to(per_token.dtype)
    return (per_token * valid).sum(1) / valid.sum(1)


def classifier_losses(model, ids, mask, types, y):
    logits = model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    return nn.functional.cross_entropy(logits, y, reduction="none")


def encoder_losses(model, ids, pad, y):
    return nn.functional.cross_entropy(model(ids, pad), y, reduction="none")


def padded(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (B, T) with right padding and the attention mask (1 = token, 0 = padding)."""
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(1, VOCAB, (len(lengths), T), generator=g)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        ids[i, n:] = 0
    return ids, mask


LENGTHS = [10, 7, 10, 4, 9, 10]


def gpt2_case():
    ids, mask = padded(LENGTHS)
    return gpt2, lm_losses, (ids, mask)


def bert_case():
    ids, mask = padded(LENGTHS)
    types = (torch.arange(T) >= 5).long().expand(B, T).clone()
    return bert, classifier_losses, (ids, mask, types, torch.tensor([0, 1, 2, 0, 1, 2]))


def bert_mlm_case():
    return bert_mlm, mlm_losses, padded(LENGTHS)


def encoder_case(causal: bool = False):
    ids, mask = padded(LENGTHS)
    return (lambda: Encoder(causal=causal)), encoder_losses, (ids, mask == 0, torch.tensor([0, 1, 2, 0, 1, 2]))


CASES: dict[str, Callable] = {
    "gpt2": gpt2_case,
    "bert": bert_case,
    "bert_masked_lm": bert_mlm_case,
    "transformer_encoder": encoder_case,
    "transformer_encoder_causal": lambda: encoder_case(causal=True),  # a (T, T) attn_mask
}


# -- the harness ---------------------------------------------------------------------------------


def private(model: nn.Module, inputs: tuple, *, mode: str = "fast", clip: float = 1.0):
    data = DataLoader(TensorDataset(*inputs), batch_size=len(inputs[0]))
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    return make_private(
        model, opt, data, noise_multiplier=1.0, delta=1e-5, epochs=1, max_grad_norm=clip, grad_mode=mode
    )


def engine_result(model, losses, inputs, clip, mode="fast"):
    """(per-example norms, clipped sums by parameter name, margin) from make_private's engine."""
    names = {id(p): n for n, p in model.named_parameters()}
    engine = private(model, inputs, mode=mode, clip=clip).optimizer.engine
    losses(model, *inputs).mean().backward()
    sums, batch, norms = engine.clipped_sum(clip, torch.float64)
    assert batch == len(inputs[0])
    return norms, {names[id(p)]: s for p, s in zip(engine.params, sums, strict=True)}, engine.last_margin


def oracle(model, losses, inputs):
    """Per-example gradients by running each example alone (plain autograd): {name: (B, *shape)}."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # a tied parameter once
    per: dict[str, list[torch.Tensor]] = {n: [] for n, _ in named}
    for i in range(len(inputs[0])):
        loss = losses(model, *(x[i : i + 1] for x in inputs)).sum()
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        for (n, p), g in zip(named, grads, strict=True):
            per[n].append(torch.zeros_like(p) if g is None else g)
    return {n: torch.stack(v).double() for n, v in per.items()}


def oracle_norms(per: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.sqrt(sum(g.reshape(g.shape[0], -1).square().sum(1) for g in per.values()))


def oracle_sums(per: dict[str, torch.Tensor], clip: float, margin: float) -> dict[str, torch.Tensor]:
    c = torch.clamp(clip * (1 - margin) / oracle_norms(per), max=1.0)
    return {n: torch.einsum("b,b...->...", c, g) for n, g in per.items()}


def compare(make, losses, inputs, *, dtype=torch.float32, mode="fast", seed=0):
    torch.manual_seed(seed)
    inputs = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
    model = make().to(dtype)
    reference = copy.deepcopy(model)
    per = oracle(reference, losses, inputs)
    want_norms = oracle_norms(per)
    for clip in (float(want_norms.median()), 1e6):  # about half the examples clipped / none
        got_norms, got, margin = engine_result(copy.deepcopy(model), losses, inputs, clip, mode)
        tol = TOL[dtype]
        torch.testing.assert_close(got_norms, want_norms, rtol=tol["norm"], atol=0.0)
        want = oracle_sums(per, clip, margin)
        assert got.keys() == want.keys()
        scale = max(float(w.abs().max()) for w in want.values())
        for name, w in want.items():
            torch.testing.assert_close(got[name], w, rtol=tol["sum"], atol=tol["sum"] * scale, msg=name)
    return want_norms


# -- the oracle comparisons -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_transformer_matches_one_example_at_a_time(case: str, dtype: torch.dtype) -> None:
    make, losses, inputs = CASES[case]()
    norms = compare(make, losses, inputs, dtype=dtype)
    assert bool((norms > 0).all())


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # torch.func's SDPA fallback
@pytest.mark.parametrize("case", ["gpt2", "transformer_encoder"])
def test_vmap_mode_agrees_on_transformers(case: str) -> None:
    make, losses, inputs = CASES[case]()
    compare(make, losses, inputs, dtype=torch.float64, mode="vmap")


def test_every_transformer_layer_takes_the_fast_path() -> None:
    for name, case in CASES.items():
        make, losses, inputs = case()
        engine = private(make(), inputs).optimizer.engine
        kinds = {unit: kind for unit, kind, _ in engine.describe()}
        if name == "bert_masked_lm":  # the prediction head owns its output bias directly
            assert kinds.pop("cls.predictions") == "vmap"
            assert engine.shared() == [["bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"]]
        assert set(kinds.values()) == {"fast"}, name


def test_gpt2_tied_weight_has_one_per_example_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """lm_head.weight is wte.weight: the per-example norm is that of the sum of both uses'
    gradients (with the cross term), and the noise covers the shared parameter once."""
    make, losses, inputs = gpt2_case()
    torch.manual_seed(0)
    model = make().double()
    assert model.lm_head.weight is model.transformer.wte.weight
    reference = copy.deepcopy(model)
    want = oracle_norms(oracle(reference, losses, inputs))
    opt = private(copy.deepcopy(model), inputs).optimizer
    assert opt.engine.shared() == [["transformer.wte.weight", "lm_head.weight"]]
    trainable = sum(p.numel() for p in model.parameters())  # each parameter once
    assert opt.noise.size == trainable == sum(p.numel() for p in opt.engine.params)

    got, _, _ = engine_result(copy.deepcopy(model), losses, inputs, 1.0)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=0.0)
    # two separate norms (no cross term) would be wrong: the test can tell
    monkeypatch.setattr(per_example, "inner", lambda r1, r2, shape: torch.zeros(B, dtype=torch.float64))
    separate, _, _ = engine_result(copy.deepcopy(model), losses, inputs, 1.0)
    assert float(((separate - want).abs() / want).max()) > 1e-3


class TiedLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 5)
        self.b = nn.Linear(5, 5)
        self.b.weight = self.a.weight
        self.out = nn.Linear(5, 3)

    def forward(self, x, y):
        logits = self.out(torch.tanh(self.b(torch.tanh(self.a(x)))))  # (B, T, 3)
        return nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(1)


class SharedEmbedding(nn.Module):
    """An encoder-decoder's shared embedding (two Embedding modules, one weight) and a Linear
    read-out tied to it too."""

    def __init__(self) -> None:
        super().__init__()
        self.src = nn.Embedding(20, 6)
        self.tgt = nn.Embedding(20, 6)
        self.tgt.weight = self.src.weight
        self.read = nn.Linear(6, 20, bias=False)
        self.read.weight = self.src.weight
        self.mix = nn.Linear(6, 6)

    def forward(self, a, b, y):
        h = torch.tanh(self.mix(self.src(a).mean(1, keepdim=True) + self.tgt(b)))
        return nn.functional.cross_entropy(self.read(h).transpose(1, 2), y, reduction="none").mean(1)


@pytest.mark.parametrize("mode", ["fast", "vmap"])
def test_other_ties_match_the_oracle(mode: str) -> None:
    g = torch.Generator().manual_seed(5)
    compare(
        lambda: TiedLinears(),
        lambda m, x, y: m(x, y),
        (torch.randn(B, 3, 5, generator=g), torch.randint(0, 3, (B, 3), generator=g)),
        dtype=torch.float64,
        mode=mode,
    )
    compare(
        lambda: SharedEmbedding(),
        lambda m, a, b, y: m(a, b, y),
        (torch.randint(0, 20, (B, 4), generator=g), torch.randint(0, 20, (B, 5), generator=g),
         torch.randint(0, 20, (B, 5), generator=g)),
        dtype=torch.float64,
        mode=mode,
    )  # fmt: skip


# -- single layers ----------------------------------------------------------------------------------


class Layers(nn.Module):
    """Conv1D on 3-D and 2-D inputs, LayerNorm over two dimensions without bias, RMSNorm with
    and without eps, and a Linear layer on (B, T, d) in each branch of the per-layer rule."""

    def __init__(self) -> None:
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        self.proj = Conv1D(12, 6)  # weight (6, 12)
        self.ln = nn.LayerNorm((3, 4), bias=False)
        self.rms = nn.RMSNorm(12)
        self.rms_eps = nn.RMSNorm(12, eps=1e-3)
        self.ghost = nn.Linear(12, 40)  # T = 4: 2·T² = 32 <= 480, Gram matrices
        self.narrow = nn.Linear(40, 2)  # 32 <= 80, Gram matrices
        self.small = nn.Linear(2, 2)  # 32 > 4: materialised
        self.pool = Conv1D(3, 12)

    def forward(self, x, y):
        h = self.proj(x)  # (B, T, 12)
        h = self.ln(h.view(*h.shape[:-1], 3, 4)).flatten(-2)
        h = self.rms_eps(self.rms(h))
        h = self.small(self.narrow(torch.tanh(self.ghost(h))))
        logits = self.pool(torch.cat([h, h], -1).repeat(1, 1, 3)).mean(1) + self.pool(h.repeat(1, 1, 6)[:, 0])
        return nn.functional.cross_entropy(logits, y, reduction="none")


@pytest.mark.parametrize("mode", ["fast", "vmap"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_conv1d_and_norm_layers_match_the_oracle(mode: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(B, 4, 6, generator=g).to(dtype), torch.randint(0, 3, (B,), generator=g)
    compare(Layers, lambda m, x, y: m(x, y), (x, y), dtype=dtype, mode=mode)
    kinds = {n: k for n, k, _ in private(Layers(), (x, y), mode=mode).optimizer.engine.describe()}
    assert set(kinds.values()) == {"fast" if mode == "fast" else "vmap"}


def test_the_per_layer_rule_is_the_book_keeping_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ghost norm when 2T² <= d_in·d_out, else the per-example gradient is materialised."""
    assert uses_ghost_norm(16, 32, 16) and not uses_ghost_norm(17, 32, 16)
    branches: list[tuple[int, bool]] = []
    original = matmul.Product.add_norms

    def spy(self, norms):
        original(self, norms)
        branches.append((self.a.shape[1], self.direct is not None))

    monkeypatch.setattr(matmul.Product, "add_norms", spy)
    for t in (3, 9):
        model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))  # d_in·d_out = 24 and 12
        x = torch.randn(B, t, 4)
        engine = private(model, (x,)).optimizer.engine
        model(x).sum().backward()
        engine.clipped_sum(1.0, torch.float64)
    assert branches == [(3, False), (3, True), (9, True), (9, True)]  # 2·9 <= 24, 18 > 12; 162 > both


# -- nn.MultiheadAttention ----------------------------------------------------------------------


def test_attention_dropout_is_replayed_in_the_recomputation() -> None:
    """Training mode with dropout: the recomputed attention draws the same dropout masks, so with
    no clipping the per-example gradients add up to the ordinary batch gradient."""
    make, losses, inputs = encoder_case()
    torch.manual_seed(0)
    model = Encoder(dropout=0.3).double()
    reference = copy.deepcopy(model)
    names = {id(p): n for n, p in model.named_parameters()}
    engine = private(model, inputs, clip=1e9).optimizer.engine
    state = torch.get_rng_state()
    losses(model, *inputs).mean().backward()
    after = torch.get_rng_state()
    sums, _, _ = engine.clipped_sum(1e9, torch.float64)
    assert torch.equal(torch.get_rng_state(), after)  # the replay leaves the generator as it was
    torch.set_rng_state(state)
    losses(reference, *inputs).mean().backward()
    want = {n: p.grad for n, p in reference.named_parameters()}
    for p, s in zip(engine.params, sums, strict=True):
        torch.testing.assert_close(s / B, want[names[id(p)]], rtol=1e-9, atol=1e-12, msg=names[id(p)])


def test_encoder_in_eval_mode_skips_the_nested_tensor_fast_path() -> None:
    g = torch.Generator().manual_seed(2)
    x, pad = torch.randn(B, T, 8, generator=g), padded(LENGTHS)[1] == 0
    y = torch.tensor([0, 1, 2, 0, 1, 2])

    def make():
        return FeatureEncoder().eval()

    compare(make, lambda m, x, pad, y: nn.functional.cross_entropy(m(x, pad), y, reduction="none"), (x, pad, y))


class SeparateDims(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, kdim=5, vdim=3, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, q, k, v, y):
        out, weights = self.attn(q, k, v, need_weights=True, average_attn_weights=False)
        return nn.functional.cross_entropy(self.head(out.mean(1)) + weights.sum((1, 2))[:, :3], y, reduction="none")


def test_attention_with_other_key_and_value_sizes_and_used_weights() -> None:
    g = torch.Generator().manual_seed(4)
    inputs = (torch.randn(B, 4, 8, generator=g), torch.randn(B, 7, 5, generator=g),
              torch.randn(B, 7, 3, generator=g), torch.randint(0, 3, (B,), generator=g))  # fmt: skip
    compare(SeparateDims, lambda m, *a: m(*a), inputs, dtype=torch.float64)


def test_attention_with_bias_kv_falls_back_to_torch_func() -> None:
    class BiasKV(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True)
            self.head = nn.Linear(8, 3)

        def forward(self, x, y):
            return nn.functional.cross_entropy(self.head(self.attn(x, x, x)[0].mean(1)), y, reduction="none")

    g = torch.Generator().manual_seed(4)
    inputs = (torch.randn(B, 4, 8, generator=g), torch.randint(0, 3, (B,), generator=g))
    compare(BiasKV, lambda m, *a: m(*a), inputs, dtype=torch.float64)
    kinds = {n: k for n, k, _ in private(BiasKV(), inputs).optimizer.engine.describe()}
    assert kinds == {"attn": "vmap", "head": "fast"}


# -- refusals -----------------------------------------------------------------------------------------


def test_batch_first_false_attention_is_refused_with_the_fix() -> None:
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    with pytest.raises(InvalidParameterError, match="batch_first=True"):
        private(nn.TransformerEncoder(layer, 1, enable_nested_tensor=False), (torch.randn(4, 3, 8),))


def test_gradient_checkpointing_is_refused_with_the_fix() -> None:
    model = gpt2()
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    ids, mask = padded(LENGTHS)
    with pytest.raises(InvalidParameterError, match=r"checkpointing_disable\(\)"):
        private(model, (ids, mask))
    assert all(p.requires_grad for p in model.parameters())  # nothing was attached


def test_a_layer_on_a_tensor_shared_by_the_batch_is_refused_with_the_fix() -> None:
    class SharedBias(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pos = nn.Linear(2, 4)
            self.fc = nn.Linear(4, 3)
            self.register_buffer("grid", torch.randn(1, 5, 2))

        def forward(self, x):
            return self.fc(x + self.pos(self.grid)).mean(1)

    model = SharedBias()
    x = torch.randn(B, 5, 4)
    opt = private(model, (x,)).optimizer
    model(x).sum().backward()
    with pytest.raises(InvalidDataError, match=r"expand its input to the batch"):
        opt.step()


def test_unbatched_input_to_a_norm_layer_is_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    private(model, (torch.randn(B, 4),))
    with pytest.raises(InvalidDataError, match="first dimension indexes the examples"):
        model[1](torch.randn(4))
