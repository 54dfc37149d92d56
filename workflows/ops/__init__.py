"""Operations: starting or joining Ray (ray_utils), placement groups, the GPU plan and memory estimate (gpu_plan;
the GPU check that runs it is an experiment), cluster jobs (submit), progress bars, a full disk in one line and no
restart on it (disk, disk_callback), processes taking turns a step each (turns: ``tracerl bench peer --interleave
step``). The lowest room of workflows/: it imports no other.

Public face: ``ray_utils.init_ray``, ``ray_utils.torch_trainer``, ``ray_utils.check_resources``,
``submit.submit``, ``progress.bar``, ``gpu_plan.memory_estimate``, ``disk.no_space``, ``disk.DiskFull``.
"""
