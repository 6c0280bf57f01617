"""k-anonymity (k-匿名) and why it is not enough: the textbook's two-hospital linkage story.

§5.1, tables 5.1-5.3: hospital A's patient table identifies Zhao Lina (the only 56-year-old).
Generalising age and zip (table 5.2) makes it k-anonymous, yet joined with hospital B's equally
generalised table (5.3) the only diagnosis both "50-60, female" classes share is HIV: anyone known
to have visited both hospitals with those attributes is pinned down.  Then Mondrian
(LeFevre et al. 2006) k-anonymises UCI Adult to k = 10 and reports time and information loss.

UCI Adult is read from ``adult.data`` in the directory given as the command's argument, else in
``$DPKIT_ADULT``, else in ``<repo>/../shared/data/adult/``; without it that last part is skipped.

Run:  .venv/bin/python examples/k_anonymity_and_linkage.py [ADULT_DIR]
"""

import argparse
import os
import time
from pathlib import Path

import pandas as pd

from dpkit.anonymity import anonymity_report, generalise, k_anonymity
from dpkit.attacks import linkage_attack

DEFAULT_ADULT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "adult"
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "adult",
    nargs="?",
    type=Path,
    default=Path(os.environ.get("DPKIT_ADULT") or DEFAULT_ADULT),
    help="directory holding adult.data (default: $DPKIT_ADULT, else ../shared/data/adult/ beside the repository)",
)
args = parser.parse_args()

pd.set_option("display.width", 120)

table_5_1 = pd.DataFrame(
    {
        "name": ["李国强", "王秀英", "张建华", "陈玉兰", "刘志强", "赵丽娜", "周志成", "马文杰", "李梅"],
        "age": [64, 61, 67, 63, 69, 56, 52, 59, 55],
        "sex": ["男", "女", "男", "女", "男", "女", "男", "男", "女"],
        "zip": ["190146", "190118", "190104", "190146", "190115", "190103", "190146", "190130", "190146"],
        "smoker": ["是", "否", "是", "否", "是", "否", "是", "是", "否"],
        "dx": ["心脏病", "关节炎", "肺癌", "克罗恩病", "肺癌", "艾滋病", "糖尿病", "过敏性鼻炎", "溃疡性胃炎"],
    }
)
qi = ["age", "sex", "zip"]
print("Table 5.1 (hospital A, raw): k =", k_anonymity(table_5_1, qi), "on", qi)

table_5_2 = table_5_1.drop(columns="name").assign(age=["60-70"] * 5 + ["50-60"] * 4, zip="1901**")
print("Table 5.2 (hospital A, generalised):", anonymity_report(table_5_2, qi, sensitive="dx"))

table_5_3 = pd.DataFrame(
    {
        "age": ["50-60"] * 3 + ["60-70"] * 3,
        "sex": ["女"] * 3 + ["男"] * 3,
        "zip": ["1901**"] * 6,
        "dx": ["艾滋病", "系统性红斑狼疮", "干燥综合征", "胰腺癌", "肝硬化", "通风"],
    }
)
print("Table 5.3 (hospital B, generalised):", anonymity_report(table_5_3, qi, sensitive="dx"))

res = linkage_attack(table_5_2, table_5_3, qi, "dx")
print("\nLinkage of the two releases (classes of A, assuming the person is in both):")
print(res.matches.to_string(index=False))
known = table_5_1.loc[table_5_1["name"] == "赵丽娜", ["name", *qi]]
res_known = linkage_attack(table_5_2, table_5_3, qi, "dx", known=known, identifier="name")
print(
    "\nAttacker knows 赵丽娜 (56, 女, 190103) visited both:",
    res_known.matches[["name", "candidates", "value"]].to_string(index=False),
)

adult = args.adult / "adult.data"
if adult.exists():
    df = pd.read_csv(adult, skipinitialspace=True)
    aqi = ["age", "sex", "race", "native-country"]
    print(f"\nUCI Adult: {len(df)} rows, raw k = {k_anonymity(df, aqi)} on {aqi}")
    for k, suppress in [(10, 0.0), (10, 0.01), (50, 0.0)]:
        t0 = time.perf_counter()
        out, rep = generalise(df, aqi, k, suppress=suppress)
        dt = time.perf_counter() - t0
        print(
            f"  Mondrian k={k:3d} suppress={suppress:.2f}: {dt:.3f} s, k achieved "
            f"{k_anonymity(out, aqi)}, {rep.n_classes} classes, {rep.n_suppressed} suppressed, "
            f"NCP {rep.ncp:.4f} {dict(rep.ncp_per_qi)}, DM {rep.discernibility}"
        )
    print(out[aqi].drop_duplicates().head(5).to_string(index=False))
else:
    print("\nUCI Adult not found at", adult, "- skipped")
