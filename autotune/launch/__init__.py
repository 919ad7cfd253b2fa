"""launch: a cubin becomes a running kernel on torch's current stream.

Owns: the CUDA driver binding (libcuda.py), the kernel's parameter block and input checks (params.py:
FlashFwdParams, InputShape, make_params), loading a cubin and launching it (loader.py: KernelRunner, and
Relaunch for a prepared launch run again on other tensors of one geometry), Hopper
tensor maps for the wgmma family (tma.py), which GPU and arch this is (gpu_arch.py), and blocks per SM from a
build's resources (occupancy.py).

May import: space/ only. Nothing else of autotune. torch and cuda-python are imported where needed.

Public names: params.FlashFwdParams, InputShape, make_params, validate_inputs, dtype_name, ALIGN_BYTES;
loader.KernelRunner, Relaunch, as_runner, attention_with; tma.launch_extra_args, launch_map_encoders;
gpu_arch.detect_arch, resolve_arch,
NoGpuError; occupancy.blocks_per_sm; libcuda.driver, error_name.
"""
