"""Write the tuned-lens tables of docs/readme_residual.md from the stored measurements (the lenses' own
held-out reports, analysis/zoo/lenses/*/tuned_lens.json, and benchmarks/results/residual_tuned_lens.json):

    python scripts/tuned_lens_docs.py

tests/unit/test_residual_docs.py checks the numbers against the same files."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from analysis.framework.paths import DOCS, RESULTS  # noqa: E402
from analysis.residual.translators import META, folder_for  # noqa: E402

STATES = (0, 1, 2, 3, 10, 15, 20, 24, 29)
REFERENCE_STATES = {"shapes-lm": (0, 1, 2, 3), "smollm2-135m-instruct": (0, 1, 2, 5, 10, 15, 20, 25, 28, 29)}
SHORT = {"shapes-lm": "shapes-lm", "smollm2-135m-instruct": "SmolLM2"}


def lens_table() -> str:
    columns = []
    for name in ("shapes-lm", "smollm2-135m-instruct"):
        meta = json.loads((folder_for(name) / META).read_text())
        for label, m in meta["held_out_kl_nats"].items():
            columns.append((f"{SHORT[name]}, {label} ({m['tokens']:,} tokens): logit → tuned", m))
    rows = ["| state | " + " | ".join(c for c, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for s in STATES:
        cells = [f"{m['logit'][s]:.2f} → {m['tuned'][s]:.2f}" if s < len(m["logit"]) - 1 else "" for _, m in columns]
        rows.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def reference_table() -> str:
    models = json.loads((RESULTS / "residual_tuned_lens.json").read_text())["models"]
    out = []
    for name, r in models.items():
        for label, m in r["held_out"].items():
            out.append(f"{SHORT[name]}, {label} ({m['tokens']:,} tokens; {r['steps']} steps × {r['batch_tokens']} "
                       f"tokens, lr {r['lr']:g}): worst ratio {m['worst_ratio']:.2f}\n")
            out.append("| state | logit lens | reference recipe | shipped lens | shipped / reference |")
            out.append("|---|---|---|---|---|")
            for s in REFERENCE_STATES[name]:
                out.append(f"| {s} | {m['logit'][s]:.2f} | {m['reference'][s]:.2f} | {m['shipped'][s]:.2f} | "
                           f"{m['shipped_over_reference'][s]:.2f} |")
            out.append("")
    return "\n".join(out).rstrip()


def main() -> int:
    path = DOCS / "readme_residual.md"
    text = path.read_text()
    text = re.sub(r"\| state \| shapes-lm, .*?\n\| 29 \|[^\n]*", lambda _: lens_table(), text, count=1, flags=re.S)
    block = f"<!-- tuned-reference -->\n{reference_table()}\n<!-- /tuned-reference -->"
    if "TUNED_REFERENCE_TABLE" in text:
        text = text.replace("TUNED_REFERENCE_TABLE", block)
    else:
        text = re.sub(r"<!-- tuned-reference -->.*?<!-- /tuned-reference -->", lambda _: block, text, flags=re.S)
    path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
