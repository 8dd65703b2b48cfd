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
# the float32 property against the reference (values, gradient, every metric), plain path
P = "tests/core/test_properties*.py -k 'matches_reference_float32 and plain'"
M = [
    # (what breaks, file, the exact text, its replacement, the tests that must catch it)
    (
        "A = 0 takes the A < 0 branch",
        "gmpo_core/_math.py",
        "    sgn = sign + (sign == 0)",
        "    sgn = sign - (sign == 0)",
        "tests/core/test_hand_cases.py tests/core/test_properties*.py -k plain",
    ),
    (
        "a token on its bound is cut (minimum splits the gradient at a tie)",
        "gmpo_core/_math.py",
        "cq = torch.where(q > cap, cap, q)",
        "cq = torch.minimum(q, cap.expand_as(q))",
        "tests/core/test_hand_cases.py -k 'bound and plain'",
    ),
    (
        "masked values multiplied instead of selected",
        "gmpo_core/_math.py",
        "r = torch.where(valid, logp - to_dtype(b.old_logp, dt), 0)",
        "r = (logp - to_dtype(b.old_logp, dt)) * mf",
        "tests/core/test_properties*.py -k 'padding_invariance and plain'",
    ),
    (
        "no n > 0 guard on the policy term (empty rows give -A)",
        "gmpo_core/_math.py",
        "active = (sign * n) != 0",
        "active = sign != 0",
        "tests/core/test_hand_cases.py tests/core/test_properties*.py -k plain",
    ),
    (
        "no A != 0 guard on the policy term (NaN from A = 0 rows)",
        "gmpo_core/_math.py",
        "active = (sign * n) != 0",
        "active = n > 0",
        "tests/core/test_properties*.py -k 'zero_advantage and plain'",
    ),
    (
        "written gradient not divided by B",
        "gmpo_core/_math.py",
        "to_tokens(constant(policy) / (nf * rows_b), seg)",
        "to_tokens(constant(policy) / nf, seg)",
        "tests/core/test_properties*.py -k 'backward_with_random_upstream and plain'",
    ),
    (
        "KL gradient with the wrong sign",
        "gmpo_core/_math.py",
        "grad = grad - em1.detach()",
        "grad = grad + em1.detach()",
        "tests/core/test_properties*.py -k 'plain and (kl or matches_reference)'",
    ),
    (
        "dual-clipped tokens counted as eps-clipped",
        "gmpo_core/_counts.py",
        "((c.cut_rows + c.signed_rows) / 2).unsqueeze(0)",
        "((c.cut_rows - c.signed_rows) / 2).unsqueeze(0)",
        "tests/core/test_hand_cases.py tests/core/test_properties*.py -k plain",
    ),
    (
        "A < 0 rows counted as clipped high",
        "gmpo_core/_counts.py",
        "torch.stack((sign.clamp(max=0), sign.clamp(min=0)))",
        "torch.stack((sign.clamp(max=0), sign.abs()))",
        f"{P} tests/core/test_hand_cases.py",
    ),
    (
        "log-ratio range over masked tokens too",
        "gmpo_core/_counts.py",
        'return extreme(r + far, "min")',
        'return extreme(r, "min")',
        f"{P}",
    ),
    (
        "low_min over empty rows too",
        "gmpo_core/_counts.py",
        "fractions = torch.where(n > 0, rows / nf, math.inf)",
        "fractions = rows / nf",
        f"{P}",
    ),
    (
        "no valid token: the range stays at the largest float, not inf",
        "gmpo_core/_counts.py",
        "minima = torch.where(minima >= torch.finfo(c.lo.dtype).max, math.inf, minima)",
        "minima = minima",
        "tests/core/test_hand_cases.py tests/core/test_properties*.py -k plain",
    ),
    (
        "zero-weight tokens not removed",
        "gmpo_core/_math.py",
        "return valid if w_tok is None else valid & (w_tok != 0)",
        "return valid",
        "tests/core/test_properties*.py -k 'zero_weight and plain' tests/core/test_hand_cases.py",
    ),
    (
        "mean over B = 0 rows divides by zero",
        "gmpo_core/_math.py",
        "rows_b = max(per_seq.shape[0], 1)",
        "rows_b = per_seq.shape[0]",
        "tests/core/test_hand_cases.py -k empty_batch",
    ),
    (
        "backward ignores the per-row upstream gradient's B factor",
        "gmpo_core/loss.py",
        "scale = _math.to_dtype(g_ps, grad.dtype) * max(len(g_ps), 1)",
        "scale = _math.to_dtype(g_ps, grad.dtype)",
        "tests/core/test_properties*.py -k 'backward_with_random_upstream and plain'",
    ),
    (
        "backward ignores an upstream gradient of loss other than 1",
        "gmpo_core/loss.py",
        'if g_ps is not None or scale.device.type != "cpu" or scale.item() != 1.0:',
        "if g_ps is not None:",
        "tests/core/test_compile.py -k scaled_loss",
    ),
    (
        "create_graph gets the first-order gradient without a graph",
        "gmpo_core/loss.py",
        "if grad is None or g_lc is not None or torch.is_grad_enabled():",
        "if grad is None or g_lc is not None:",
        "tests/core/test_properties*.py -k 'second_order or penalty'",
    ),
    (
        "advantages not detached",
        "gmpo_core/loss.py",
        "adv=x.advantages.detach(),",
        "adv=x.advantages,",
        "tests/core/test_compile.py -k advantages_get_no_gradient",
    ),
    (
        "devices not checked",
        "gmpo_core/_checks.py",
        'check_devices("logp", logp, others)  # type: ignore[arg-type]',
        "pass",
        "tests/core/devices/test_devices.py -k 'another_device or check_devices'",
    ),
    (
        "metrics: region = low only",
        "gmpo_core/metrics.py",
        '"clip_ratio/region_mean": low + high,',
        '"clip_ratio/region_mean": low,',
        f"{P}",
    ),
    (
        "entropy of a -inf logit is 0 * -inf",
        "gmpo_core/lm_head.py",
        "sc.mul_(blk.clamp_(min=_LOG_ZERO))",
        "sc.mul_(blk)",
        "tests/core/test_lm_head.py -k masked_vocabulary",
    ),
    (
        "verl token-mean accepts too few global tokens",
        "adapters/gmpo_verl/loss.py",
        'if mode == "token-mean" and batch.denominator < local_tokens:',
        "if False:",
        "tests/verl/test_loss_config.py -k too_few_global_tokens",
    ),
    (
        "packed row sums accumulate in float32",
        "gmpo_core/_rows.py",
        "x64 = x.to(torch.float64)\n    if differentiated(x):",
        "x64 = x\n    if differentiated(x):",
        "tests/core/test_segments.py -k 'long_segment or exact_past'",
    ),
    (
        "the gradient is written under no_grad",
        "gmpo_core/loss.py",
        "with_grad = logp.requires_grad and torch.is_grad_enabled()",
        "with_grad = logp.requires_grad",
        "tests/core/test_transforms.py -k no_gradient",
    ),
    (
        "transformed calls go through the autograd.Function",
        "gmpo_core/loss.py",
        "if torch.compiler.is_compiling() or _transformed(b):",
        "if torch.compiler.is_compiling():",
        "tests/core/test_transforms.py -k func",
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
            f"cd {root} && PYTHONPATH={root}/adapters HYPOTHESIS_PROFILE=${{HYPOTHESIS_PROFILE:-ci}} timeout 600 {python} -m pytest -q -x -p no:cacheprovider {tests}",
            shell=True,
            capture_output=True,
            text=True,
        )
        last = [line for line in r.stdout.splitlines() if line.strip()][-1]
        verdict = "CAUGHT" if r.returncode == 1 else f"MISSED rc={r.returncode}"
        print(f"{i:2d} {verdict:10s} {name}  [{tests}]  -> {last}", flush=True)
    finally:
        f.write_text(src)
