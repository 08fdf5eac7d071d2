"""Launch an autotuned kernel with the config it chose, without the autotuner's per-call cost.

Triton's ``Autotuner.run`` rebuilds a dict of every argument and its cache key on each
call. On the H100 host that was about 0.1 ms of Python per launch (cProfile, 2026-11-23),
and a training step launches three autotuned kernels: at N = 512 the step was bound by
the host, not the GPU (benchmarks/TUNING.md). The first call for a key goes through the
autotuner, which benchmarks its configs; later calls with the same key launch the plain
JIT kernel with the remembered config (after its ``pre_hook``, which sets the block
shapes of host tensor descriptors).
"""
from __future__ import annotations

from ._common import tensor_of

#: (autotuner, key values..., dtypes...) -> the triton.Config it chose.
_CHOSEN: dict = {}


def launch_tuned(autotuned, grid, *args, **kwargs) -> None:
    """``autotuned[grid](*args, **kwargs)``, skipping the autotuner once it has chosen for this key.

    The key is the autotuner's own: its ``key`` arguments plus the dtypes of the tensor
    arguments (a host tensor descriptor counts with its tensor's dtype), so a config is never
    reused where the autotuner would have tuned again.
    """
    named = kwargs if all(name in kwargs for name in autotuned.keys) else dict(zip(autotuned.arg_names, args),
                                                                                   **kwargs)
    key = (autotuned, *(named[name] for name in autotuned.keys),
           *(str(t.dtype) for t in map(tensor_of, args) if hasattr(t, "dtype")))
    config = _CHOSEN.get(key)
    if config is None:
        autotuned[grid](*args, **kwargs)
        _CHOSEN[key] = autotuned.best_config
    else:
        if config.pre_hook is not None:  # e.g. block shapes of host tensor descriptors
            config.pre_hook({**dict(zip(autotuned.arg_names, args)), **kwargs, **config.kwargs})
        autotuned.fn[grid](*args, **kwargs, **config.all_kwargs())
