"""DP-SGD on peft LoRA models: only the adapters are trained, clipped and noised.

``get_peft_model`` freezes the base model (requires_grad=False); ``make_private`` must then leave
every frozen parameter bit-identical (no gradient, no norm contribution, no noise, no optimizer
state), clip and noise the trainable ones only (the noise plan's size is their count), and
account exactly as for any model (ε depends on σ, the steps and the sample rate only). The
clipped sum of the adapters' gradients is compared with a one-example-at-a-time oracle (float64,
1e-12 relative, as in ``test_transformers.py``).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from dpkit.errors import DPError, InvalidParameterError  # noqa: E402
from dpkit.torch import make_private  # noqa: E402

N, B, T, VOCAB = 24, 6, 8, 100
# peft asks transformers 5 for the renamed is_gradient_checkpointing
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    yield
    torch.set_num_threads(before)


def gpt2(targets: tuple[str, ...] = ("c_attn", "c_fc"), **lora) -> nn.Module:
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    base = transformers.GPT2LMHeadModel(cfg)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(targets), fan_in_fan_out=True, **lora
    )
    return peft.get_peft_model(base, config)


def bert() -> nn.Module:
    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=32, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    base = transformers.BertForSequenceClassification(cfg)
    config = peft.LoraConfig(r=4, target_modules=["query", "value"], task_type="SEQ_CLS", init_lora_weights=False)
    return peft.get_peft_model(base, config)  # the classifier head is trained too (modules_to_save)


def lm_losses(model, ids, mask):
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    per_token = nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    valid = mask[:, 1:].to(per_token.dtype)
    return (per_token * valid).sum(1) / valid.sum(1)


def cls_losses(model, ids, mask, y):
    return nn.functional.cross_entropy(model(input_ids=ids, attention_mask=mask).logits, y, reduction="none")


def tokens(n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (n, T), generator=g)
    mask = torch.ones(n, T, dtype=torch.long)
    mask[::3, T - 3 :] = 0  # some right padding
    return ids.masked_fill(mask == 0, 0), mask


def trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def private(model, data, optimizer=None, **kw):
    opt = optimizer or torch.optim.SGD(model.parameters(), lr=0.5)
    kw = {"noise_multiplier": 1.0, "delta": 1e-5, "epochs": 1, "max_grad_norm": 1.0, **kw}
    return make_private(model, opt, DataLoader(data, batch_size=B), rng=np.random.default_rng(7), **kw)


def test_only_the_adapters_are_clipped_and_noised() -> None:
    model = gpt2()
    train = trainable(model)
    assert train and all("lora_" in n for n, _ in train)
    n_train = sum(p.numel() for _, p in train)
    assert n_train < sum(p.numel() for p in model.parameters()) / 10
    opt = private(model, TensorDataset(*tokens())).optimizer
    assert {id(p) for p in opt.engine.params} == {id(p) for _, p in train}
    assert opt.noise.size == n_train  # the noise is drawn for the trainable parameters only
    assert {k for _, k, _ in opt.engine.describe()} == {"fast"}


def test_frozen_parameters_are_bit_identical_after_private_steps() -> None:
    """AdamW with weight decay over *all* the model's parameters: a frozen parameter would move
    if it got a gradient (even pure noise) or an update from the decay."""
    model = gpt2()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    adapters = [n for n, _ in trainable(model)]  # (while private, dpkit marks them requires_grad=False)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    training = private(model, TensorDataset(*tokens()), optimizer=adamw)
    m, opt, loader = training
    steps = 0
    for ids, mask in loader:
        opt.zero_grad()
        lm_losses(m, ids, mask).mean().backward()
        opt.step()
        steps += 1
    assert steps == len(loader) and opt.steps == steps
    after = dict(model.named_parameters())
    for n in frozen:
        assert torch.equal(after[n], before[n]), n
        assert after[n].grad is None
    assert all(not torch.equal(after[n], before[n]) for n in adapters)  # every adapter moved (lora_B from 0)
    assert set(adamw.state.keys()) == {after[n] for n in adapters}  # no optimizer state for frozen weights
    training.detach()
    assert all(not after[n].requires_grad for n in frozen)
    assert all(after[n].requires_grad for n in adapters)


def test_accounting_is_the_same_as_for_any_model() -> None:
    """ε depends on σ, the steps and the sample rate, not on which parameters are trained."""
    ids, mask = tokens()
    lora = private(gpt2(), TensorDataset(ids, mask))
    plain_model = nn.Linear(T, 2)
    plain = private(plain_model, TensorDataset(ids.float(), mask))
    assert lora.optimizer.step_event == plain.optimizer.step_event
    for opt, run in ((lora.optimizer, lambda b: lm_losses(lora.module, *b)),
                     (plain.optimizer, lambda b: plain_model(b[0]).sum(1))):  # fmt: skip
        for batch in lora.data_loader if opt is lora.optimizer else plain.data_loader:
            opt.zero_grad()
            run(batch).mean().backward()
            opt.step()
    assert lora.optimizer.steps == plain.optimizer.steps == N // B
    assert lora.get_epsilon() == plain.get_epsilon() > 0


def per_example(model, losses, inputs):
    named = trainable(model)
    out: dict[str, list[torch.Tensor]] = {n: [] for n, _ in named}
    for i in range(len(inputs[0])):
        grads = torch.autograd.grad(losses(model, *(x[i : i + 1] for x in inputs)).sum(), [p for _, p in named])
        for (n, _), g in zip(named, grads, strict=True):
            out[n].append(g.double())
    return {n: torch.stack(v) for n, v in out.items()}


def gpt2_embedding(**lora) -> nn.Module:
    """LoRA on the token embedding too: peft's lora.Embedding keeps its adapters in
    nn.ParameterDicts and uses them in its own forward (a torch.func unit)."""
    return gpt2(("wte", "c_attn"), **lora)


@pytest.mark.parametrize("make", [gpt2, gpt2_embedding, bert], ids=["gpt2", "gpt2_embedding", "bert"])
def test_adapter_clipped_sum_matches_one_example_at_a_time(make) -> None:
    model = make(init_lora_weights=False) if make is not bert else make()  # random lora_B: every adapter gets gradients
    model = model.double()
    ids, mask = tokens(B)
    inputs = (ids, mask) if make is not bert else (ids, mask, torch.tensor([0, 1, 2, 0, 1, 2]))
    losses = lm_losses if make is not bert else cls_losses
    per = per_example(copy.deepcopy(model), losses, inputs)
    norms = torch.sqrt(sum(g.reshape(B, -1).square().sum(1) for g in per.values()))
    clip = float(norms.median())
    names = {id(p): n for n, p in model.named_parameters()}
    engine = private(model, TensorDataset(*inputs), max_grad_norm=clip).optimizer.engine
    losses(model, *inputs).mean().backward()
    sums, _, got_norms = engine.clipped_sum(clip, torch.float64)
    torch.testing.assert_close(got_norms, norms, rtol=1e-12, atol=0.0)
    c = torch.clamp(clip * (1 - engine.last_margin) / norms, max=1.0)
    got = {names[id(p)]: s for p, s in zip(engine.params, sums, strict=True)}
    assert got.keys() == per.keys()
    for n, g in per.items():
        want = torch.einsum("b,b...->...", c, g)
        torch.testing.assert_close(got[n], want, rtol=1e-12, atol=1e-12 * float(want.abs().max()), msg=n)


def test_dora_is_refused_with_the_fix() -> None:
    model = gpt2(use_dora=True)
    with pytest.raises(InvalidParameterError, match=r"use_dora=False"):
        private(model, TensorDataset(*tokens()))


def test_a_weight_unfrozen_after_make_private_is_refused_at_the_step() -> None:
    """Its gradient would come from plain autograd, unclipped: the step refuses before paying."""
    model = gpt2()
    m, opt, loader = private(model, TensorDataset(*tokens()))
    wte = model.get_parameter("base_model.model.transformer.wte.weight")
    before = wte.detach().clone()
    wte.requires_grad_(True)
    ids, mask = next(iter(loader))
    lm_losses(m, ids, mask).mean().backward()
    with pytest.raises(DPError, match="became trainable after make_private"):
        opt.step()
    assert opt.steps == 0 and torch.equal(wte, before)
