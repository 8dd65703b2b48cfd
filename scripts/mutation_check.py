"""Mutation check: break gmpo_core on purpose, one way at a time, and show a test catches it.

Copies the working tree to a temporary directory, applies each mutation there (the checkout is
never touched), runs the tests that guard it with the "ci" Hypothesis profile, and prints
CAUGHT or MISSED. Usage: python scripts/mutation_check.py [index ...]
"""

import pathlib
import shutil
import subprocess
import sys
import tempfile

repo = pathlib.Path(__file__).resolve().parents[1]
root = pathlib.Path(tempfile.mkdtemp(prefix="gmpo-mutants-"))
files = subprocess.run(
    ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
    cwd=repo,
    capture_output=True,
    text=True,
    check=True,
).stdout.split()
for name in files:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    if (repo / name).is_file():
        shutil.copy2(repo / name, root / name)
python = sys.executable
M = [
    (
        "A = 0 takes the A < 0 branch",
        "gmpo_core/ops.py",
        "pos = adv >= 0",
        "pos = adv > 0",
        "tests/test_properties.py -k 'matches_reference_float32 and eager'",
    ),
    (
        "mask by multiplication in the masked mean",
        "gmpo_core/ops.py",
        "return torch.where(valid, x, 0).sum(-1) / n",
        "return (x * valid).sum(-1) / n",
        "tests/test_properties.py -k 'ignore_masked'",
    ),
    (
        "no n > 0 guard on the policy term (empty rows give -A)",
        "gmpo_core/loss.py",
        "active = (adv != 0) & (n > 0)",
        "active = adv != 0",
        "tests/test_properties.py -k 'clipped_tokens_empty and eager'",
    ),
    (
        "no A != 0 guard (A = 0 rows with inf)",
        "gmpo_core/loss.py",
        "active = (adv != 0) & (n > 0)",
        "active = n > 0",
        "tests/test_properties.py -k 'zero_advantage_rows_are_exactly_zero and eager'",
    ),
    (
        "backward: strict < at the bounds",
        "gmpo_core/fused.py",
        "unclipped = (r >= _rows(lo, r)) & (r <= _rows(hi, r))",
        "unclipped = (r > _rows(lo, r)) & (r < _rows(hi, r))",
        "tests/test_hand_cases.py -k 'bound and compiled'",
    ),
    (
        "backward: KL gradient dropped",
        "gmpo_core/fused.py",
        "        grad = grad - torch.where(valid, torch.expm1(ref_logp.to(cdt) - lp) * kl_scale, 0)\n",
        "",
        "tests/test_properties.py -k 'matches_reference_float32 and compiled'",
    ),
    (
        "high clip counts A >= 0",
        "gmpo_core/ops.py",
        "return torch.where(adv < 0, clipped, 0), torch.where(adv > 0, clipped, 0), None",
        "return torch.where(adv < 0, clipped, 0), torch.where(adv >= 0, clipped, 0), None",
        "tests/test_properties.py -k 'matches_reference_float32 and eager'",
    ),
    (
        "token weights: arithmetic instead of geometric mean",
        "gmpo_core/loss.py",
        "log_coef + _masked_mean(torch.log(w_tok), valid, n)",
        "log_coef + torch.log(_masked_mean(w_tok, valid, n))",
        "tests/test_properties.py -k 'matches_reference_float32 and eager'",
    ),
    (
        "zero-weight tokens not removed",
        "gmpo_core/ops.py",
        "return valid if w_tok is None else valid & (w_tok != 0)",
        "return valid",
        "tests/test_properties.py -k 'zero_weight and eager'",
    ),
    (
        "k3 without expm1",
        "gmpo_core/ops.py",
        "return torch.expm1(d) - d",
        "return torch.exp(d) - 1 - d",
        "tests/test_properties.py -k 'tiny'",
    ),
    (
        "dual clip ignored",
        "gmpo_core/ops.py",
        "hi = torch.where(pos, eps_high, inf if log_dual is None else log_dual)",
        "hi = torch.where(pos, eps_high, inf)",
        "tests/test_properties.py -k 'trust_region and eager'",
    ),
    (
        "forward: log_ratio max over valid ignores mask",
        "gmpo_core/ops.py",
        '_masked_extreme(_masked_extreme(r, valid, "max", dim=-1), n > 0, "max")',
        '_masked_extreme(r.amax(-1), n > 0, "max")',
        "tests/test_properties.py -k 'matches_reference_float32 and eager'",
    ),
    (
        "forward-written gradient: per-row upstream not scaled by B",
        "gmpo_core/fused.py",
        "scale = grad_ps * grad_ps.shape[0]",
        "scale = grad_ps",
        "tests/test_compile.py -k 'written_by_the_forward_equals'",
    ),
    (
        "forward-written gradient: upstream scalar ignored",
        "gmpo_core/fused.py",
        'grad_loss.device.type == "cpu" and grad_loss.item() == 1.0',
        'grad_loss.device.type == "cpu"',
        "tests/test_compile.py -k 'written_by_the_forward'",
    ),
    (
        "one-pass kernel: value on a bound counted as clipped",
        "gmpo_core/_onepass.py",
        "below += r.lt(vlo);",
        "below += r.le(vlo);",
        "tests/test_onepass.py",
    ),
    (
        "one-pass kernel: gradient not divided by the row's token count",
        "gmpo_core/_onepass.py",
        "const Vec coef((g * policy) / nf);",
        "const Vec coef(g * policy);",
        "tests/test_properties.py -k 'matches_reference_float32 and compiled'",
    ),
    (
        "one-pass kernel: a NaN log-ratio does not reach the row's minimum",
        "gmpo_core/_onepass.py",
        "extrema[i] = has_nan ? nan : ",
        "extrema[i] = ",
        "tests/test_onepass.py",
    ),
]
only = sys.argv[1:]
for i, (name, path, old, new, tests) in enumerate(M):
    if only and str(i) not in only:
        continue
    f = root / path
    src = f.read_text()
    if old not in src:
        raise SystemExit(f"mutation {i} ({name}) no longer applies: the code changed")
    f.write_text(src.replace(old, new, 1))
    try:
        r = subprocess.run(
            f"cd {root} && HYPOTHESIS_PROFILE=ci timeout 600 {python} -m pytest -q -x -p no:cacheprovider {tests}",
            shell=True,
            capture_output=True,
            text=True,
        )
        last = [line for line in r.stdout.splitlines() if line.strip()][-1]
        verdict = "CAUGHT" if r.returncode == 1 else f"MISSED rc={r.returncode}"
        print(f"{i:2d} {verdict:10s} {name}  [{tests}]  -> {last}", flush=True)
    finally:
        f.write_text(src)
