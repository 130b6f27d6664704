"""The two textbook wins from ../shared/DESIGN.md §2, as workloads: what the demo and the acceptance tests run."""

import jax

from benches.workload import Workload


def matmul_chain(scale: str = "full") -> Workload:
    """(A @ B) @ v: XLA keeps the order; re-associated it is two matrix-vector products."""
    n, m = (1024, 8) if scale == "full" else (64, 4)
    ka, kb, kv = jax.random.split(jax.random.PRNGKey(0), 3)
    args = (jax.random.normal(ka, (n, n)), jax.random.normal(kb, (n, n)), jax.random.normal(kv, (n, m)))
    return Workload("matmul_chain", lambda a, b, v: (a @ b) @ v, args, note=f"A, B {n}x{n}, v {n}x{m}")


def distributivity(scale: str = "full") -> Workload:
    """x @ W1 + x @ W2: XLA will not factor it; x @ (W1 + W2) is one GEMM."""
    rows, k = (4096, 512) if scale == "full" else (64, 32)
    kx, k1, k2 = jax.random.split(jax.random.PRNGKey(1), 3)
    args = (jax.random.normal(kx, (rows, k)), jax.random.normal(k1, (k, k)), jax.random.normal(k2, (k, k)))
    return Workload("distributivity", lambda x, w1, w2: x @ w1 + x @ w2, args, note=f"x {rows}x{k}, W {k}x{k}")


EXAMPLES = {"matmul_chain": matmul_chain, "distributivity": distributivity}
