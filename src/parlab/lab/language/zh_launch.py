"""Chinese templates of the course's messages (:mod:`parlab.lab.language`): English template → 中文.

The launcher's messages a learner acts on (``parlab.lab.launch``): a rank's error, a hang report, the GPU queue's
place. Its log lines and internal errors stay English."""

MESSAGES: dict[str, str] = {
    "; ": "；",
    # -- a rank's error (errors.py) ----------------------------------------------------------------------
    "rank {rank} of {world_size} raised {type_name}: {message}":
        "rank {rank}（共 {world_size} 个）抛出了 {type_name}：{message}",
    "Traceback on rank {rank} (most recent call last):": "rank {rank} 上的 Traceback（最近一次调用在最后）：",
    "rank {rank} of {world_size} {what}{oom}.": "rank {rank}（共 {world_size} 个）{what}{oom}。",
    " (on Linux the out-of-memory killer sends SIGKILL: check memory per rank)":
        "（在 Linux 上，内存不足时 OOM killer 会发送 SIGKILL：请检查每个 rank 的内存）",
    "Last lines rank {rank} wrote to stderr:": "rank {rank} 最后写入 stderr 的几行：",
    "The other ranks:": "其他 rank：",
    "ended without reporting": "没有报告就结束了",
    "was killed by signal {name} ({number})": "被信号 {name}（{number}）终止",
    "exited with code {code} before its function returned": "在它的函数返回之前以退出码 {code} 退出",
    # -- a hang (errors.py, _diagnosis.py) ---------------------------------------------------------------
    "{summary} (timeout={timeout:g} s).": "{summary}（timeout={timeout:g} s）。",
    "no progress": "没有进展",
    "Where each rank was:": "各 rank 当时的位置：",
    "Every rank must call the same collectives, in the same order, with tensors of the same size. Raise the limit "
    "with timeout=... if the work is merely slow.":
        "每个 rank 都必须以相同的顺序、用相同大小的张量调用相同的集合通信。如果只是计算慢，用 timeout=... 调高时限。",
    "had returned from its function {seconds:.1f} s before": "已在 {seconds:.1f} s 前从它的函数返回",
    "waited in a collective until it timed out ({message}), at:": "在集合通信中一直等到超时（{message}），位置：",
    "waiting in a collective, at:": "正在集合通信中等待，位置：",
    "busy outside any collective, at:": "正忙于集合通信之外的工作，位置：",
    "{ranks} waited {timeout:g} s in a collective": "{ranks} 在集合通信中等待了 {timeout:g} s",
    "{ranks} was still busy elsewhere (if it is just slow, raise timeout)":
        "{ranks} 仍在忙别的（如果只是慢，就调大 timeout）",
    "{ranks} were still busy elsewhere (if it is just slow, raise timeout)":
        "{ranks} 仍在忙别的（如果只是慢，就调大 timeout）",
    "{ranks} had already returned, so never joined it": "{ranks} 已经返回，所以从未加入它",
    "{ranks} had already returned": "{ranks} 已经返回",
    "rank {ranks}": "rank {ranks}",
    "ranks {ranks}": "rank {ranks}",
    # -- each rank's status (_diagnosis.py) --------------------------------------------------------------
    "had returned": "已经返回",
    "raised {type}: {message} (a follow-on error: a rank it was talking to had gone)":
        "抛出了 {type}：{message}（连带错误：与它通信的某个 rank 已经退出）",
    "raised {type}: {message}": "抛出了 {type}：{message}",
    "returned a value that cannot be pickled": "返回了一个无法 pickle 的值",
    "was still running; stopped by parlab": "仍在运行；已被 parlab 停止",
    "rank {rank} of {world_size} returned a value that cannot be pickled ({error}), so it cannot travel back to the "
    "notebook. Return plain values: numbers, strings, lists, dicts, numpy arrays or tensors.":
        "rank {rank}（共 {world_size} 个）返回了一个无法 pickle 的值（{error}），所以它无法传回 notebook。"
        "请返回普通的值：数字、字符串、列表、dict、numpy 数组或张量。",
    "rank {rank} returned a value the notebook cannot unpickle: {type}: {error}":
        "rank {rank} 返回的值无法在 notebook 中 unpickle：{type}：{error}",
    # -- the GPU queue (lease.py) ------------------------------------------------------------------------
    "first in the queue": "排在队列第一位",
    "place {place} in the queue ({ahead} launch ahead of this one)": "排在队列第 {place} 位（前面还有 {ahead} 次启动）",
    "place {place} in the queue ({ahead} launches ahead of this one)": "排在队列第 {place} 位（前面还有 {ahead} 次启动）",
    "No holder recorded yet.": "尚未记录占用者。",
    "Held: {holders}.": "占用情况：{holders}。",
    "GPU {gpu} by {holder}": "GPU {gpu} 被 {holder} 占用",
    "{world_size} free GPU(s) needed from PARLAB_GPUS={asked_for!r} ({gpus}), but for {wait:g} s only {free} were "
    "free. {holders} This launch was {place}. Wait for them, or ask for fewer ranks; PARLAB_GPU_WAIT sets how long "
    "to wait.":
        "需要从 PARLAB_GPUS={asked_for!r}（{gpus}）中得到 {world_size} 个空闲 GPU，但在 {wait:g} s 内只有 {free} 个空闲。"
        "{holders}本次启动{place}。请等它们释放，或申请更少的 rank；PARLAB_GPU_WAIT 设置等待多久。",
    "parlab: waiting for {world_size} free GPU(s) of {gpus} (up to {wait:g} s), {place}. {holders}":
        "parlab：正在等待 {gpus} 中的 {world_size} 个空闲 GPU（最多 {wait:g} s），{place}。{holders}",
    "parlab: now {place} for {world_size} GPU(s) (waited {waited:.0f} s)":
        "parlab：为 {world_size} 个 GPU 现在{place}（已等待 {waited:.0f} s）",
    # -- a launch's arguments (launcher.py, plan.py) ---------------------------------------------------------
    "world_size must be an int (the number of ranks, e.g. 2 or 4); got {type} {value!r}":
        "world_size 必须是 int（rank 的个数，例如 2 或 4）；得到 {type} {value!r}",
    "world_size must be at least 1 (the number of ranks, e.g. 2 or 4); got {value}":
        "world_size 至少为 1（rank 的个数，例如 2 或 4）；得到 {value}",
    "backend must be one of {allowed}; got {backend!r}": "backend 必须是 {allowed} 之一；得到 {backend!r}",
    "timeout must be a positive number of seconds; got {timeout!r}": "timeout 必须是正的秒数；得到 {timeout!r}",
    "threads must be a positive int (CPU threads per rank) or None; got {threads!r}":
        "threads 必须是正的 int（每个 rank 的 CPU 线程数）或 None；得到 {threads!r}",
    "world_size={world_size} would start {world_size} processes on a machine with {cores} CPU core(s); parlab "
    "allows at most {most} CPU ranks here, since each rank holds its own copy of the model and they would only fight "
    "for the cores. Use a smaller world_size, or set the environment variable PARLAB_MAX_RANKS to raise the limit.":
        "world_size={world_size} 会在一台只有 {cores} 个 CPU 核的机器上启动 {world_size} 个进程；parlab 在这里最多允许 "
        "{most} 个 CPU rank，因为每个 rank 都持有自己的一份模型，它们只会争抢 CPU 核。请用更小的 world_size，"
        "或设置环境变量 PARLAB_MAX_RANKS 来提高上限。",
    "{fn} or its arguments cannot be sent to the ranks ({type}: {error}). Functions, classes, tensors and plain "
    "values travel; open files, sockets, locks and generators do not.":
        "{fn} 或它的参数无法发送给各 rank（{type}：{error}）。函数、类、张量和普通的值可以传过去；"
        "打开的文件、socket、锁和生成器不行。",
    "fn must be callable: a function each rank runs, like `def work(): ...`; got {type} {fn!r:.60}":
        "fn 必须是可调用的：每个 rank 运行的函数，比如 `def work(): ...`；得到 {type} {fn!r:.60}",
    "output must be one of {allowed}; got {output!r}": "output 必须是 {allowed} 之一；得到 {output!r}",
    "kwargs must be a dict or None; got {type}": "kwargs 必须是 dict 或 None；得到 {type}",
    "args must be a tuple or list of positional arguments; got {type}": "args 必须是由位置参数组成的 tuple 或 list；得到 {type}",
    "start_method must be one of {allowed} or None (this platform's default, {default!r}); got {start_method!r}":
        "start_method 必须是 {allowed} 之一，或 None（本平台的默认值 {default!r}）；得到 {start_method!r}",
    "start_method='zygote' forks the ranks, and this platform cannot fork; use start_method='spawn' (the default "
    "here)":
        "start_method='zygote' 用 fork 启动各 rank，而本平台不能 fork；请用 start_method='spawn'（这里的默认值）",
}
