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
}
