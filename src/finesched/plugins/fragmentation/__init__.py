"""GPU fragmentation with respect to a target workload, and the FGD score (Weng et al., ATC'23).

The measure. A *target workload* M is a set of task specs m = (cpu_m, k_m GPUs of d_m milli each,
allowed GPU models S_m) with weights p_m (frequencies). For node n with free CPU c_n and free
milli r_g on each GPU (R_n = Σ_g r_g)::

    f_n(m) = R_n                        if d_m = 0 (CPU-only task), or the node's model is not in S_m,
                                        or m does not fit (c_n < cpu_m or fewer than k_m GPUs with r_g >= d_m)
           = Σ_g r_g · [r_g < d_m]      otherwise (only GPUs too small for m are fragments)
    F_n(M) = Σ_m p_m · f_n(m)           (expected idle GPU milli a random task of M cannot use)

Worked example: a node with 4 CPUs free and GPUs at 1000, 300, 0 milli (R = 1300); M = {A: 2 CPUs
x 500 m, p 0.5; B: 8 CPUs x 100 m, p 0.25; C: CPU-only, p 0.25}. f(A) = 300 (the 300 m GPU is too
small; A fits on the 1000 m one), f(B) = 1300 (B lacks CPU), f(C) = 1300, so
F = 0.5·300 + 0.25·1300 + 0.25·1300 = 800.

FGD (`FGDScore`) places a task where F rises least: Δ_n = F_{n'}(M) − F_n(M) for n' = n after the
placement; score ⌊100·σ(−Δ_n/1000)⌋. A share task tries every GPU with room and keeps the best
(the artifact compares the *integer* scores and keeps the lowest GPU index among equals; ``gpuChoice:
delta`` compares Δ exactly instead); k whole GPUs take fully free GPUs; a CPU-only task only
lowers c_n. Example above, placing a 1 CPU x 300 m task: on the 300 m GPU the node becomes 3 CPUs,
GPUs 1000/0/0: f(A) = 0, f(B) = f(C) = 1000, F' = 500, Δ = −300, score ⌊100·σ(0.3)⌋ = 57; on the
1000 m GPU (left 700): f(A) = 300, F' = 650, Δ = −150, score 53. FGD takes the 300 m GPU.

Speed. Weights are kept as integer counts, so Δ·W (W = Σ counts) is exact and equal states give
exactly Δ = 0. `FragmentationIndex` caches f_n(m) per node and, per task shape (cpu, k, d), Δ and the
chosen GPU for every node; a node is recomputed only when it changed (one per placement), in one
numpy pass over the changed nodes × GPUs × specs.

The target M comes from a trace (`TargetWorkload.from_pods`, the protocol's top specs covering 95 %
of pods) or is learned online from a sliding window of recent requests (`OnlineTarget`).
"""

from finesched.plugins.fragmentation.index import (
    FragmentationIndex,
    GpuView,
    accessible,
    fgd_score,
    fragment_terms,
    node_fragmentation,
)
from finesched.plugins.fragmentation.plugin import (
    MAX_EXACT,
    FGDExact,
    FGDScore,
    GpuPick,
    constraint_text,
    exact_order,
    first_k,
    stranded_milli,
    task_shape,
)
from finesched.plugins.fragmentation.target import (
    GPU_MODEL_LABEL,
    MAX_CLASSES,
    MILLI,
    OnlineTarget,
    Shape,
    TargetWorkload,
)

__all__ = [
    "GPU_MODEL_LABEL",
    "MAX_CLASSES",
    "MAX_EXACT",
    "MILLI",
    "FGDExact",
    "FGDScore",
    "FragmentationIndex",
    "GpuPick",
    "GpuView",
    "OnlineTarget",
    "Shape",
    "TargetWorkload",
    "accessible",
    "constraint_text",
    "exact_order",
    "fgd_score",
    "first_k",
    "fragment_terms",
    "node_fragmentation",
    "stranded_milli",
    "task_shape",
]
