#!/usr/bin/env bash
# The whole test suite on the GPU machine in one call (one H100/H200; aim: under 9 minutes).
#
#   .ci/gpu_suite.sh [pytest args]      e.g. -x, or paths to run a part (none: all of tests/)
#   BACKEND=reference .ci/gpu_suite.sh   every test on the reference (plain-JAX) kernels instead
#
# - the kernel tests run on both the triton and the reference backend (FUSEDRL_TEST_BACKENDS);
# - every other test runs with the triton kernels: on a GPU with jax-triton a config's
#   `kernels.backend: auto` is triton, with the ops' measured small-shape crossovers (checked first:
#   the script stops if triton cannot run); tests that name a backend keep theirs, and CPU
#   subprocesses (JAX_PLATFORMS=cpu) resolve auto to reference;
# - pytest-xdist spreads the tests over WORKERS processes (default 14, for a 16-core machine) that
#   share the GPU: no memory preallocation, at most 6% of its memory each; `--dist loadgroup` with the
#   groups of tests/conftest.py keeps each module's tests (and the programs its fixtures compile) on
#   one worker, except the modules listed in its SPREAD_MODULES (README blocks, the fused PPO gradient,
#   the PPO, recurrent PPO, SAC and sweep training tests), whose tests spread;
# - XLA does not autotune the GPU's kernels by timing them (`--xla_gpu_autotune_level=0`, added to
#   XLA_FLAGS unless they set a level): no candidate kernels are timed at compile time (the suite is
#   mostly compiles), and every run picks the same kernels, not ones chosen by the timing noise of 14
#   workers sharing the GPU (with autotuning, learning tests saw other rounding under load);
# - the pytest run is stopped with SIGINT after SUITE_SECONDS (default 550) so that a slow run still
#   reports what it did (pytest prints its counts on SIGINT), inside a 600 s device call;
# - with $OUT set, $OUT/gpu_suite_<backend>.log holds pytest's log and ..._times.tsv each test's
#   worker and seconds, written as it finishes; the busiest workers' totals are printed last.
# On a machine without network, the packages it lacks come from wheels in .whl/ (installed into
# /tmp/site first): here pytest-xdist, execnet, tensorboardX, protobuf, jax-triton, dm-haiku, jmp,
# gymnasium, farama-notifications, jaxmarl and its needs, Jumanji and its needs (esquilax, which
# imports jax_tqdm and tqdm), and ruff (its executable put on PATH for tests/test_lint.py); the
# wandb tests skip without wandb.
cd "$(dirname "$0")/.."
if [ -d .whl ]; then
  # (under a lock: two suites may start at once, one per GPU, sharing /tmp/site)
  flock /tmp/site.lock python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && export PATH=/tmp/site/bin:$PATH
fi
set -uo pipefail

export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.06}
case "${XLA_FLAGS:-}" in
  *xla_gpu_autotune_level*) ;;
  *) export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_autotune_level=0" ;;
esac
BACKEND=${BACKEND:-auto}
case "$BACKEND" in
  auto) export FUSEDRL_TEST_BACKENDS=${FUSEDRL_TEST_BACKENDS:-triton,reference}; rest="auto (triton)" ;;
  reference) export FUSEDRL_KERNEL_BACKEND=reference FUSEDRL_TEST_BACKENDS=reference; rest="reference" ;;
  *) echo "gpu_suite: BACKEND must be auto or reference, not '$BACKEND'" >&2; exit 2 ;;
esac
export PYTHONPATH=${PYTHONPATH:-$PWD}
WORKERS=${WORKERS:-14}
SUITE_SECONDS=${SUITE_SECONDS:-550}

# First: is the triton backend usable here? (GPU_SUITE_CHECK=0 skips this, to try the script on a CPU.)
if [ "${GPU_SUITE_CHECK:-1}" != 0 ]; then
  python3 - <<'EOF' || exit 2
import jax
from kernels.launch import resolve_backend, triton_unavailable_reason

print("devices:", jax.devices(), "| jax", jax.__version__)
reason = triton_unavailable_reason() if jax.default_backend() == "gpu" else f"no GPU (default JAX backend: {jax.default_backend()})"
if reason:
    raise SystemExit(f"gpu_suite: the triton backend cannot run here: {reason}")
print("kernel backend of `kernels.backend: auto`:", resolve_backend())
EOF
fi

log=${OUT:+$OUT/gpu_suite_$BACKEND.log}
log=${log:-$(mktemp)}
# each test's seconds as it finishes (tests/conftest.py), to see which worker's share set the wall time
times=${OUT:+$OUT/gpu_suite_${BACKEND}_times.tsv}
times=${times:-$(mktemp)}
: > "$times"
export FUSEDRL_TEST_TIMES=$times
start=$SECONDS
# -v: every test's outcome is logged as it finishes ("[gwN] [ p%] PASSED tests/..."), so the counts and
# the failures' names survive a run whose end-of-session summary never prints (stopped, or hung at teardown)
timeout -s INT -k 30 "$SUITE_SECONDS" python3 -m pytest -v -p no:cacheprovider -n "$WORKERS" --dist loadgroup \
  --durations=25 -rfE "$@" > "$log" 2>&1
status=$?
grep -vE "^\[gw[0-9]+\] \[ *[0-9]+%\] (PASSED|SKIPPED|XFAIL)" "$log" | tail -150
counts=$(grep -E "(passed|failed|errors?|skipped|deselected|no tests ran).* in [0-9.]+s" "$log" | tail -1 | sed 's/=//g; s/^ *//')
if [ -z "$counts" ]; then
  counts=$(for outcome in PASSED FAILED ERROR SKIPPED; do printf '%s %s, ' "$(grep -cE "^\[gw[0-9]+\] \[ *[0-9]+%\] $outcome " "$log")" "$outcome"; done)
  counts="no summary line; per-test lines: ${counts%, }"
fi
failures=$(grep -oE "^\[gw[0-9]+\] \[ *[0-9]+%\] (FAILED|ERROR) \S+" "$log" | sed -E 's/^.*(FAILED|ERROR) /\1 /')
[ -n "$failures" ] && printf 'gpu_suite: %s\n' "$failures"
echo "gpu_suite: busiest workers (seconds of test calls; per-test times in ${times}):"
awk -F'\t' '{busy[$1] += $3} END {for (w in busy) printf "  %s %.0f\n", w, busy[w]}' "$times" | sort -k2 -nr | head -4
[ "$status" = 124 ] && counts="STOPPED at the ${SUITE_SECONDS} s limit (SUITE_SECONDS), counts of what finished: ${counts}"
echo "gpu_suite: ${counts:-no summary line (see above)}; wall $((SECONDS - start)) s; backends: kernel tests ${FUSEDRL_TEST_BACKENDS}, rest ${rest}; exit ${status}"
[ -n "${OUT:-}" ] || rm -f "$log" "$times"
exit "$status"
