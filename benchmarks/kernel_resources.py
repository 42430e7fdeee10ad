"""What one program of the fused PPO gradient kernels (or the Q-learning and twin-critic ones)
holds on an H100, without a GPU.

    python benchmarks/kernel_resources.py                          # PureJaxRL's CartPole sizes
    python benchmarks/kernel_resources.py --obs 16 --hidden 128 128 --actions 16 --warps 8 \\
        --block 32
    python benchmarks/kernel_resources.py --op q_grads --hidden 256 256 --precision bf16 \\
        --warps 8 --block 64                                       # DQN's gradient, 256 wide

Compiles `kernels.ppo_grads`'s actor and critic kernels ahead of time for sm_90 with the installed
Triton and its bundled ptxas (`triton.compile` with a CUDA target needs no GPU), reads each cubin's
registers per thread and stack bytes (`cuobjdump --dump-resource-usage`) and Triton's shared-memory
request, and prints how many programs fit on one SM:

    programs per SM = min(65536 // (warps * 32 * regs'), 233472 // (shared + 1024), 64 // warps, 32)

with regs' the registers per thread rounded up to a multiple of 8 (sm_90: 64K registers, 228 KB of
shared memory with 1 KB reserved per program, 64 warps and 32 programs per SM). Occupancy is what
bounds these latency-bound kernels at thousands of seeds (benchmarks/RESULTS.md, "The fused PPO
gradient"). Needs the `interpret` or `gpu` extra (Triton).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import ppo_grads  # noqa: E402
from kernels._mlp_tiles import ACTIVATION_CODES, padded  # noqa: E402

SM90 = {"registers": 65536, "shared": 233472, "reserved_shared": 1024, "warps": 64, "programs": 32}


def programs_per_sm(
    registers_per_thread: int, shared_bytes: int, warps: int, sm: dict = SM90
) -> dict:
    """How many programs of `warps` warps fit on one SM, by each limit, and the smallest (`fit`)."""
    rounded = -(-registers_per_thread // 8) * 8
    by = {
        "registers": sm["registers"] // (warps * 32 * max(rounded, 1)),
        "shared": sm["shared"] // (shared_bytes + sm["reserved_shared"]),
        "warps": sm["warps"] // warps,
        "programs": sm["programs"],
    }
    return {**by, "fit": min(by.values())}


def compile_sm90(
    kernel, constexprs: dict, int_args: tuple, warps: int, stages: int, floats: tuple = ("inv_m",)
):
    """The kernel compiled for sm_90 (pointer arguments float32, `action_ptr` int32, the scalars
    named in `floats` float32)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def arg_type(name):
        if name in constexprs:
            return "constexpr"
        if name in floats:
            return "fp32"
        if name in int_args:
            return "i32"
        return "*i32" if name == "action_ptr" else "*fp32"

    signature = {name: arg_type(name) for name in kernel.arg_names}
    # jax_triton empties TRITON_CACHE_DIR when it is imported, and triton.compile needs a cache
    # folder: a temporary one, set for this call only (the scope restores the knobs and the
    # environment)
    with tempfile.TemporaryDirectory() as cache, triton.knobs.cache.scope():
        triton.knobs.cache.dir = cache
        return triton.compile(
            ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
            target=GPUTarget("cuda", 90, 32),
            options=dict(num_warps=warps, num_stages=stages),
        )


OFFSETS = (
    "off_w1",
    "off_b1",
    "off_w2",
    "off_b2",
    "off_w3",
    "off_b3",
)  # where each array sits in the flat parameter vector


def compile_both(
    sizes: tuple,
    warps: int = ppo_grads.NUM_WARPS,
    block: int = ppo_grads.BLOCK_M,
    stages: int = 3,
    precision: str = "tf32",
    activation: str = "tanh",
) -> dict:
    """{"actor": compiled, "critic": compiled} for sizes (obs_dim, (hidden1, hidden2), actions),
    padded as the op pads them, with the launch's settings (jax-triton's default: 3 stages)."""
    obs_dim, (h1, h2), actions = sizes
    pad = padded
    common = dict(
        DP=pad(obs_dim),
        H1P=pad(h1),
        H2P=pad(h2),
        BLOCK=block,
        ACT=ACTIVATION_CODES[activation],
        PRECISION=precision,
    )
    return {
        "actor": compile_sm90(
            ppo_grads._actor_grads_kernel,
            {**common, "AP": pad(actions)},
            ("M", "ROWS", "S", "P", "D", "H1", "H2", "A", *OFFSETS),
            warps,
            stages,
        ),
        "critic": compile_sm90(
            ppo_grads._critic_grads_kernel,
            {**common, "OP": 16, "CLIP_VALUE": True},
            ("M", "ROWS", "S", "P", "D", "H1", "H2", *OFFSETS),
            warps,
            stages,
        ),
    }


Q_INTS = ("M", "S", "P", "D", "H1", "H2", "A", *OFFSETS)
TWIN_OFFSETS = tuple(f"o{i}_{n}" for i in (1, 2) for n in ("w1", "b1", "w2", "b2", "w3", "b3"))


def compile_q_ops(
    op: str, sizes: tuple, warps: int, block: int, stages: int = 3, precision: str = "tf32",
    activation: str = "relu",
) -> dict:  # fmt: skip
    """{op: compiled} for `kernels.q_grads` (op "q_grads": sizes (obs_dim, (h1, h2), actions),
    double-Q, Huber) or `kernels.twin_q_grads` (op "twin_q_grads": sizes (obs_dim + action_dim,
    (h1, h2), unused)), padded as the ops pad them, with `block` rows a program."""
    from kernels import q_grads, twin_q_grads

    inputs, (h1, h2), actions = sizes
    common = dict(
        DP=padded(inputs), H1P=padded(h1), H2P=padded(h2), BLOCK=block,
        ACT=ACTIVATION_CODES[activation], PRECISION=precision,
    )  # fmt: skip
    if op == "q_grads":
        constexprs = {**common, "AP": padded(actions), "DOUBLE_Q": True, "HUBER": True}
        return {op: compile_sm90(q_grads._q_grads_kernel, constexprs, Q_INTS, warps, stages)}
    constexprs = {**common, "OP": twin_q_grads.OUT_PAD}
    ints = ("M", "S", "P", "D", "A", "H1", "H2", *TWIN_OFFSETS)
    return {op: compile_sm90(twin_q_grads._twin_q_grads_kernel, constexprs, ints, warps, stages)}


def cubin_resources(cubin: bytes) -> dict:
    """Registers per thread and stack bytes of a cubin, from Triton's bundled cuobjdump."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(
            [str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    found = dict(re.findall(r"\b(REG|STACK):(\d+)", out))
    return {"registers": int(found["REG"]), "stack": int(found["STACK"])}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--op",
        choices=("ppo", "q_grads", "twin_q_grads"),
        default="ppo",
        help="the kernels compiled (twin_q_grads: --obs is obs_dim + action_dim)",
    )
    parser.add_argument("--obs", type=int, default=4)
    parser.add_argument("--hidden", type=int, nargs=2, default=(64, 64))
    parser.add_argument("--actions", type=int, default=2)
    parser.add_argument("--warps", type=int, default=ppo_grads.NUM_WARPS)
    parser.add_argument(
        "--block", type=int, default=ppo_grads.BLOCK_M, help="rows per inner step (BLOCK_M)"
    )
    parser.add_argument(
        "--stages", type=int, default=3, help="software-pipelining stages (jax-triton's default: 3)"
    )
    parser.add_argument("--precision", choices=ppo_grads.PRECISIONS, default="tf32")
    parser.add_argument("--activation", choices=ppo_grads.ACTIVATIONS, default="tanh")
    args = parser.parse_args(argv)
    print(
        f"obs {args.obs}, hidden {tuple(args.hidden)}, {args.actions} actions; "
        f"{args.warps} warps, {args.block}-row blocks, {args.stages} stages, "
        f"{args.precision}; sm_90"
    )
    print(
        "| kernel | registers/thread | stack bytes | shared bytes | "
        "programs/SM by registers, shared, warps | fit |"
    )
    print("|---|---|---|---|---|---|")
    sizes = (args.obs, tuple(args.hidden), args.actions)
    if args.op == "ppo":
        compiled_kernels = compile_both(
            sizes, args.warps, args.block, args.stages, args.precision, args.activation
        )
    else:
        compiled_kernels = compile_q_ops(
            args.op, sizes, args.warps, args.block, args.stages, args.precision, args.activation
        )
    for name, compiled in compiled_kernels.items():
        res = cubin_resources(compiled.asm["cubin"])
        shared = compiled.metadata.shared
        fit = programs_per_sm(res["registers"], shared, args.warps)
        print(
            f"| {name} | {res['registers']} | {res['stack']} | {shared:,} | "
            f"{fit['registers']}, {fit['shared']}, {fit['warps']} | {fit['fit']} |"
        )


if __name__ == "__main__":
    main()
