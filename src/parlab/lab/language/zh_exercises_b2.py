"""Chinese templates of the course's messages (:mod:`parlab.lab.language`): the exercise checks of chapters 09
and 10 (``ch09.py``, ``ch10.py``), as :mod:`~parlab.lab.language.zh_exercises_b` holds chapters 06 to 08's."""

MESSAGES: dict[str, str] = {
    # -- chapter 09: the culprit of a hang, MFU --------------------------------------------------------------
    "at #{seq} rank {rank}'s record has ended while the others' go on: it left the loop early. A record that ended "
    "counts as a different record, so the records differ at #{seq} (a loop over the shortest record, or over the "
    "ranks that still have one, never sees it)":
        "在 #{seq} 处，rank {rank} 的记录已经结束，而其他 rank 的还在继续：它提前离开了循环。已结束的记录也算作不同的记录，"
        "所以各记录在 #{seq} 处不同（只遍历最短的记录，或只遍历仍有记录的 rank 的循环，永远看不到这一点）",
    "at #{seq} every rank issued {op} of '{what}', but rank {rank}'s carries {numel} elements: compare the size too":
        "在 #{seq} 处，每个 rank 都发出了 '{what}' 的 {op}，但 rank {rank} 的带有 {numel} 个元素：大小也要比较",
    "return a tuple (sequence number, rank) of two ints; got {got!r:.60}":
        "请返回由两个 int 组成的元组（序号，rank）；得到 {got!r:.60}",
    "you named rank {named}, whose record stops earliest. A rank's record stops where it waits for the others: that "
    "rank is stuck, not wrong. Name the rank whose record at the divergence differs from the others'":
        "你指出的是 rank {named}，它的记录最早停下。一个 rank 的记录停在它等待其他 rank 的地方：这个 rank 是卡住了，"
        "而不是出错了。请指出在分歧处记录与其他 rank 不同的那个 rank",
    "the records first differ at #{seq}, you returned #{got}: the first difference is the evidence":
        "各记录最早在 #{seq} 处不同，你返回的是 #{got}：第一个不同之处才是证据",
    "the records are still equal at #{got}; they first differ at #{seq}": "各记录在 #{got} 处仍然相同；它们最早在 #{seq} 处不同",
    "right place (#{seq}), wrong rank: rank {rank}'s record there differs from the most common one; rank {named}'s "
    "is like the others'":
        "位置对了（#{seq}），rank 错了：rank {rank} 在那里的记录与最常见的记录不同；rank {named} 的和其他 rank 一样",
    "this exercise asks you to find the divergence yourself; the chapter's own functions are refused":
        "本练习要你自己找出分歧；本章自己的函数会被拒绝",
    "{fn} on these records:\n{shown}\nreturned {got!r}, expected {want!r}: {hint}":
        "{fn} 在这些记录上：\n{shown}\n返回了 {got!r}，应为 {want!r}：{hint}",
    "{fn} names where the records diverge and who took another path, in {count} hangs":
        "{fn} 在 {count} 次卡死中都指出了记录分歧的位置，以及是谁走了另一条路",
    "you counted the forward's FLOPs only (2Ψ per token). Backward costs twice the forward (a product for the "
    "input's gradient and one for the weight's): 6Ψ per token, and attention's 12·L·H·Q·T covers both passes too":
        "你只算了前向的 FLOPs（每个 token 2Ψ）。反向的开销是前向的两倍（一次乘积求输入的梯度，一次求权重的梯度）："
        "每个 token 6Ψ，注意力的 12·L·H·Q·T 也涵盖了前向和反向",
    "you divided by one chip's peak. The tokens per second are the whole job's: divide by all {chips:,} chips' peak":
        "你除以的是一块芯片的峰值。每秒 token 数是整个作业的：要除以全部 {chips:,} 块芯片的峰值",
    "you divided by the chips twice: the tokens per second are already the whole job's":
        "你除了两次芯片数：每秒 token 数已经是整个作业的了",
    "you left out attention: its two products per layer cost 12·L·H·Q·T FLOPs per token (forward and backward), "
    "which 6Ψ does not count":
        "你漏掉了注意力：它每层的两次乘积每个 token 要花 12·L·H·Q·T FLOPs（前向加反向），6Ψ 没有算进去",
    "return a fraction (0.46), not a percentage (46)": "请返回小数（0.46），而不是百分数（46）",
    "this exercise asks you to do the arithmetic yourself; the chapter's own functions are refused":
        "本练习要你自己算；本章自己的函数会被拒绝",
    "{fn}({shown}) returned {got!r:.60}: return a number, the MFU as a fraction":
        "{fn}({shown}) 返回了 {got!r:.60}：请返回一个数，即以小数表示的 MFU",
    "MFU is the model's FLOPs per second over the peak of every chip the job ran on":
        "MFU 是模型每秒的 FLOPs 除以作业所用全部芯片的峰值",
    "{fn}({shown}) returned {got:.6g}, expected {want:.6g}: {hint}": "{fn}({shown}) 返回了 {got:.6g}，应为 {want:.6g}：{hint}",
    "{fn} gives PaLM 540B's reported {mfu:.1%} MFU, and {count} fresh runs'":
        "{fn} 给出了 PaLM 540B 报告的 {mfu:.1%} MFU，以及 {count} 次新运行的 MFU",

    # -- chapter 10: ring attention's combine, expert parallelism's slots and dispatch ----------------------
    "fn={fn!r} must be the function you wrote": "fn={fn!r} 必须是你写的函数",
    "combine is not written yet (it raises NotImplementedError)": "combine 还没写（它抛出 NotImplementedError）",
    "your combine compared whole tensors (Python's max(m1, m2) or an if on a tensor: 'Boolean value of Tensor ... is "
    "ambiguous'); take the larger maximum row by row with torch.maximum(m1, m2)":
        "你的 combine 比较了整个张量（Python 的 max(m1, m2)，或对张量用 if：'Boolean value of Tensor ... is "
        "ambiguous'）；请用 torch.maximum(m1, m2) 逐行取较大的最大值",
    "combine returned {type}; return the tuple (m, l, acc)": "combine 返回了 {type}；请返回元组 (m, l, acc)",
    "m is not the larger of the two maxima": "m 不是两个最大值中较大的那个",
    "l or acc is a plain sum: each block's l and acc are relative to its own maximum; rescale each by exp(its m − "
    "the new m) before adding":
        "l 或 acc 是直接相加的：每个块的 l 和 acc 都相对于它自己的最大值；相加之前，先把各自乘以 exp(它的 m − 新的 m)",
    "acc / l is not the softmax-weighted sum of both blocks' values: {problem}":
        "acc / l 不是两个块的值按 softmax 加权的和：{problem}",
    "m + log l is not the log-sum-exp of both blocks' scores: {problem}":
        "m + log l 不是两个块的分数的 log-sum-exp：{problem}",
    "write the online-softmax rule yourself, from the two blocks' m, l and acc":
        "请根据两个块的 m、l 和 acc，自己写出 online softmax 的规则",
    "{fn}: {problem}": "{fn}：{problem}",
    "{fn} on rank {rank} of {world_size}: {problem}": "{fn} 在 rank {rank}（共 {world_size} 个）上：{problem}",
    "{fn}: two blocks combine exactly, and ring attention with it matches full attention on all {world_size} ranks":
        "{fn}：两个块合并得分毫不差，用它的环形注意力在全部 {world_size} 个 rank 上都与完整注意力一致",
    "count the slots yourself from routing.expert, in the priority order stated":
        "请按给定的优先顺序，根据 routing.expert 自己数槽位",
    "received is not written yet (it raises NotImplementedError)": "received 还没写（它抛出 NotImplementedError）",
    "expected {want} slots per rank, got {got}{hint}": "每个 rank 的槽位应为 {want}，得到 {got}{hint}",
    " (that caps each rank's total: the capacity is per expert; cap each expert's count at capacity, then add up "
    "the experts a rank holds)":
        "（那是给每个 rank 的总数封顶：容量是按专家算的；先把每个专家的计数封顶在 capacity，再把一个 rank 持有的专家加起来）",
    " (that counts dropped tokens too: an expert keeps at most capacity of them)":
        "（那把被丢弃的 token 也算进去了：一个专家最多保留 capacity 个）",
    " (that counts first choices only, column 0: each token makes k assignments, one per column)":
        "（那只数了第一选择，即第 0 列：每个 token 做出 k 个分配，每列一个）",
    " (that counts tokens: a token whose k choices land on one rank fills k slots there; count assignments, each "
    "expert's capped at capacity)":
        "（那数的是 token：一个 token 的 k 个选择若落在同一个 rank 上，就在那里占 k 个槽位；要数分配，"
        "每个专家的计数封顶在 capacity）",
    " (that places expert e on rank e mod ep: the experts sit in contiguous blocks, epx.placement)":
        "（那是把专家 e 放在 rank e mod ep 上：专家是按连续的块放置的，见 epx.placement）",
    " (one count per expert: add up the experts each rank holds, one number per rank)":
        "（那是每个专家一个计数：把每个 rank 持有的专家加起来，每个 rank 一个数）",
    "{fn} counts every rank's slots right on {world_size} ranks": "{fn} 在 {world_size} 个 rank 上把每个 rank 的槽位都数对了",
    "sort the assignments and count each rank's rows yourself, from expert":
        "请根据 expert 自己给分配排序，并数出每个 rank 的行数",
    "returned {type}; return the tuple (order, send)": "返回了 {type}；请返回元组 (order, send)",
    "send is {type}; return one row count per rank, a list of {n} ints":
        "send 是 {type}；请为每个 rank 返回一个行数，即由 {n} 个 int 组成的列表",
    "send has {experts} entries, one per expert: all_to_all_single takes one split per rank; add up the experts each "
    "rank holds ({n} entries)":
        "send 有 {experts} 项，每个专家一项：all_to_all_single 要的是每个 rank 一个切分；把每个 rank 持有的专家加起来"
        "（{n} 项）",
    "send has {count} entries; all_to_all_single takes one split per rank: {n}":
        "send 有 {count} 项；all_to_all_single 要的是每个 rank 一个切分：{n} 项",
    "send {send} adds up to the {tokens} tokens: every token sends one row per choice, {rows} in all (expected "
    "{want})":
        "send {send} 加起来是 {tokens} 个 token：每个 token 每个选择发送一行，共 {rows} 行（应为 {want}）",
    "send {send} counts tokens: a token whose k choices land on one rank sends k rows there, one per assignment "
    "(expected {want})":
        "send {send} 数的是 token：一个 token 的 k 个选择若落在同一个 rank 上，就向那里发送 k 行，每个分配一行（应为 {want}）",
    "send {send} places expert e on rank e mod ep: the experts sit in contiguous blocks, epx.placement (expected "
    "{want})":
        "send {send} 把专家 e 放在 rank e mod ep 上：专家是按连续的块放置的，见 epx.placement（应为 {want}）",
    "send should be {want} rows per rank, got {send}": "send 应为每个 rank {want} 行，得到 {send}",
    "order has {tokens} entries, one per token: it needs {rows}, one per assignment (a token sends a row to each of "
    "its k experts)":
        "order 有 {tokens} 项，每个 token 一项：它需要 {rows} 项，每个分配一项（一个 token 向它的 k 个专家各发送一行）",
    "order holds token indices (a // k): return the assignments a themselves, so that each row's expert is known; "
    "the token is a // k":
        "order 存的是 token 的下标 (a // k)：请返回分配 a 本身，这样才知道每一行的专家；token 是 a // k",
    "order must hold each assignment 0 … {last} once (T·k = {tokens}·{k}), got {order}":
        "order 必须把每个分配 0 … {last} 恰好存一次（T·k = {tokens}·{k}），得到 {order}",
    "order indexes expert.t().flatten(), choice by choice: index expert.flatten(), where assignment a is token a // "
    "k's choice a % k":
        "order 索引的是 expert.t().flatten()，按选择逐个排列：请索引 expert.flatten()，其中分配 a 是 token a // k 的"
        "第 a % k 个选择",
    "order is the assignments as they come, token by token: sort them by expert, so that each rank's rows are "
    "consecutive and all_to_all_single's splits cut them right":
        "order 是按 token 逐个、原样排列的分配：请按专家排序，让每个 rank 的行连在一起，all_to_all_single 的切分才能切对",
    "order sorts the experts from last to first: the first send[0] rows go to rank 0, so ascending":
        "order 把专家从后往前排了：前 send[0] 行发往 rank 0，所以要升序",
    "each rank's rows are together, but not sorted by expert within it: the receiving rank cuts its rows into "
    "experts by their counts":
        "每个 rank 的行在一起了，但在 rank 内没有按专家排序：接收的 rank 按计数把它的行切给各个专家",
    "order does not sort the assignments by expert: flat[order] must never decrease":
        "order 没有按专家给分配排序：flat[order] 必须从不减小",
    "dispatch_plan is not written yet (it raises NotImplementedError)":
        "dispatch_plan 还没写（它抛出 NotImplementedError）",
    "received a row for expert {expert}, which rank {rank} does not hold":
        "收到了专家 {expert} 的一行，而 rank {rank} 并不持有这个专家",
    "{fn}: rank {rank}'s experts received {got} rows, expected {want}: (rank, token, expert) {missing} missing":
        "{fn}：rank {rank} 的专家收到了 {got} 行，应为 {want} 行：缺少 (rank, token, expert) {missing}",
    "{fn}: every assignment reaches its expert's rank, grouped by expert, on {world_size} ranks":
        "{fn}：在 {world_size} 个 rank 上，每个分配都按专家分组，到达了其专家所在的 rank",
}
