"""Chinese templates of the course's messages (:mod:`parlab.lab.language`): the exercise checks of
the checker they share (``core.py``, ``calling.py``) and chapters 00 to 02 (``ch00.py`` … ``ch02.py``). Each English template as the code says it, its Chinese with the same ``{placeholders}`` (format specs
included). Terms follow the edition's glossary: rank, world size, the collectives' names, APIs, arguments and
printed values stay English."""

MESSAGES: dict[str, str] = {
    # -- core.py: a tensor's first difference, the one refusal, a "think" question, checks on ranks and over cases
    "expected a tensor of shape {shape}, got {kind}: {got!r:.80}":
        "应为形状 {shape} 的张量，实际得到 {kind}：{got!r:.80}",
    "expected shape {expected}, got shape {got}":
        "应为形状 {expected}，实际形状为 {got}",
    "expected dtype {expected}, got {got}":
        "应为 dtype {expected}，实际为 {got}",
    "element {where}: expected {expected:g}, got {got:g} ({bad} of {numel} elements differ)":
        "元素 {where}：应为 {expected:g}，实际为 {got:g}（{numel} 个元素中有 {bad} 个不同）",
    "{label} is the package's answer to this exercise: {why}":
        "{label} 是本包对这道练习给出的答案：{why}",
    "the check's profile hook was replaced while your code ran (sys.setprofile): {why}":
        "你的代码运行时替换了检查的 profile 钩子（sys.setprofile）：{why}",
    "{what}: {letter!r} is not one of {choices}":
        "{what}：{letter!r} 不是 {choices} 中的一个",
    "{what}: {letter!r} ({text}) is not why. {feedback}":
        "{what}：{letter!r}（{text}）不是原因。{feedback}",
    "{what}: {text}":
        "{what}：{text}",
    "  {label}: {value}":
        "  {label}：{value}",
    "fn={fn!r} must be the function you wrote (a callable taking one tensor)":
        "fn={fn!r} 应是你写的函数（一个接受一个张量的 callable）",
    "input on rank {rank}":
        "rank {rank} 上的输入",
    "expected":
        "应为",
    "got":
        "实际",
    "{fn} on rank {rank} of {world_size}: {problem}.":
        "{fn} 在 rank {rank}（共 {world_size} 个）上：{problem}。",
    "fn={fn!r} must be the function you wrote":
        "fn={fn!r} 应是你写的函数",
    "{call}: expected {expected:.4g}, got {got!r:.12}":
        "{call}：应为 {expected:.4g}，实际为 {got!r:.12}",
    "{fn} agrees with the reference on all {cases} cases":
        "{fn} 在全部 {cases} 个用例上与参考实现一致",
    # -- calling.py: a call the learner's function cannot take, or that raised
    ("{fn}{signature} cannot be called as {call}, as the check calls it: keep the parameters the exercise gives, in "
     "its order"):
        "{fn}{signature} 无法按检查的调用方式 {call} 调用：请保留练习给出的参数，并保持其顺序",
    "{fn} is not written yet (it raises NotImplementedError)":
        "{fn} 还没有写（它抛出 NotImplementedError）",
    "{call} raised {error_type}: {error}":
        "{call} 抛出了 {error_type}：{error}",
    "  at line {lineno} of {function}: {line}":
        "  位于 {function} 的第 {lineno} 行：{line}",
    "  at line {lineno} of {function}":
        "  位于 {function} 的第 {lineno} 行",
    # -- ch00.py: a rank's share of the items; which ranks a hang leaves waiting
    "fn={fn!r} must be the function you wrote, my_slice(n_items) -> (start, stop)":
        "fn={fn!r} 应是你写的函数 my_slice(n_items) -> (start, stop)",
    "{fn}({n_items}) on rank {rank} returned {share!r}: return a tuple of two ints, (start, stop)":
        "{fn}({n_items}) 在 rank {rank} 上返回了 {share!r}：请返回由两个 int 组成的 tuple，即 (start, stop)",
    ("{fn}({n_items}) with {world_size} ranks: rank {rank} starts at {start}, which overlaps the previous rank's "
     "share (items {next}… should be next); shares: {shares}"):
        "{fn}({n_items})，{world_size} 个 rank：rank {rank} 从 {start} 开始，与前一个 rank 的份额重叠（下一个应从第 {next} 项开始）；各份额：{shares}",
    ("{fn}({n_items}) with {world_size} ranks: rank {rank} starts at {start}, which leaves a gap after share (items "
     "{next}… should be next); shares: {shares}"):
        "{fn}({n_items})，{world_size} 个 rank：rank {rank} 从 {start} 开始，与前一个 rank 的份额之间留下了空隙（下一个应从第 {next} 项开始）；各份额："
        "{shares}",
    "{fn}({n_items}): rank {rank} returned stop {stop} < start {start}":
        "{fn}({n_items})：rank {rank} 返回的 stop {stop} < start {start}",
    "{fn}({n_items}) with {world_size} ranks: the shares end at item {end}, not {n_items}: {shares}":
        "{fn}({n_items})，{world_size} 个 rank：各份额在第 {end} 项结束，而不是 {n_items}：{shares}",
    "{fn}({n_items}) with {world_size} ranks: shares of {sizes} items; they may differ by one at most ({why})":
        "{fn}({n_items})，{world_size} 个 rank：各份额分别有 {sizes} 项；它们最多只能相差一项（{why}）",
    "{fn} splits {cases} items over {world_size} ranks evenly, without gaps or overlaps":
        "{fn} 把 {cases} 项均匀地分给 {world_size} 个 rank，没有空隙也没有重叠",
    "the last rank took all the remainder: give one extra item to each of the first ranks instead":
        "最后一个 rank 拿走了全部余数：应改为给排在前面的 rank 每个多分一项",
    ("the last rank is left short: rounding every share up gives the others one item too many each; give one extra "
     "item to each of the first n_items % world_size ranks only"):
        "最后一个 rank 分得太少：把每个份额都向上取整，会让其他 rank 各多分一项；只给前 n_items % world_size 个 rank 每个多分一项",
    "give every rank n_items // world_size items, and one more to each of the first n_items % world_size":
        "给每个 rank 分 n_items // world_size 项，再给前 n_items % world_size 个 rank 每个多分一项",
    "waiting_ranks={waiting_ranks!r} must be a list of rank numbers, e.g. [1, 3]":
        "waiting_ranks={waiting_ranks!r} 应是由 rank 编号组成的 list，例如 [1, 3]",
    "the launch did not hang: with an odd number of ranks in a barrier it should":
        "这次启动没有挂起：只有部分 rank 进入 barrier 时，它本应挂起",
    ("you predicted ranks {predicted} would be left waiting, but the launcher found {waiting} rank(s) waiting in the "
     "barrier, and not those. A collective completes only when every rank of the group has called it: which ranks "
     "called it, and which had already returned?"):
        "你预测 rank {predicted} 会被留下等待，但启动器发现有 {waiting} 个 rank 在 barrier 中等待，而且不是这些。只有进程组中的每个 rank 都调用了一个集合通信操作，它才会完成："
        "哪些 rank 调用了它，哪些已经返回了？",
    "ranks {waiting} waited in the barrier for ranks that never came, as you predicted":
        "正如你的预测，rank {waiting} 在 barrier 中等待那些永远不会到来的 rank",
    # -- ch01.py: a gated MLP's saved bytes, activation scaling, the largest model that fits
    ("the exercise asks you to count the tensors yourself (activation_saves tells you what ReLU keeps), not to "
     "measure or estimate them"):
        "这道练习要你自己数出这些张量（activation_saves 会告诉你 ReLU 保存了什么），而不是测量或估算它们",
    (" You counted one s·b·i tensor too many: ask activation_saves what ReLU keeps, and which tensors are the same "
     "storage."):
        "你多算了一个 s·b·i 的张量：问问 activation_saves，ReLU 保存了什么，以及哪些张量共用同一块存储。",
    " The input x is kept too (by the gate and up projections: one tensor).":
        "输入 x 也被保存了（gate 和 up 两个投影共用它：一个张量）。",
    " Check the bytes per value: the case may be bf16.":
        "检查每个值的字节数：这个用例可能是 bf16。",
    "{fn}({args}) = {got!r}; measured {measured:,} bytes.{hint}":
        "{fn}({args}) = {got!r}；实测为 {measured:,} 字节。{hint}",
    "{fn} matches what autograd keeps in all {cases} cases":
        "{fn} 在全部 {cases} 个用例上都与 autograd 保存的一致",
    "the exercise asks for the factors worked out from the formula s·b·h·(34 + 5·a·s/h), not taken from the estimator":
        "这道练习要的是由公式 s·b·h·(34 + 5·a·s/h) 推出的倍数，而不是从估算器取来的",
    ("{failure}\nAt b=1, b // 2 is 0: a micro-batch of 1 halved is b / 2 = 0.5 in the formula (the factor is a ratio "
     "of two counts, not a batch you run)."):
        "{failure}\n在 b=1 时，b // 2 等于 0：微批次为 1 时减半，在公式里是 b / 2 = 0.5（这个倍数是两个计数之比，而不是你要运行的批次）。",
    " Halving s halves the 34·s·b·h part, but the attention scores, 5·a·s²·b, are s × s: they shrink four times.":
        "s 减半时，34·s·b·h 这部分减半，但注意力分数 5·a·s²·b 是 s × s 的：它缩小为四分之一。",
    "{fn}({args}): expected ({by_batch:.4g}, {by_sequence:.4g}), got {got!r:.60}.{hint}":
        "{fn}({args})：应为 ({by_batch:.4g}, {by_sequence:.4g})，实际为 {got!r:.60}。{hint}",
    "{fn} predicts both factors for all {cases} layers":
        "{fn} 对全部 {cases} 个层都预测对了两个倍数",
    "the exercise asks for the bytes per parameter worked out yourself, not the estimator's":
        "这道练习要你自己算出每个参数的字节数，而不是用估算器的结果",
    "{fn}({args}): expected {expected:.4g}, got {got}.{hint}":
        "{fn}({args})：应为 {expected:.4g}，实际为 {got}。{hint}",
    "the optimizer state":
        "优化器状态",
    "the optimizer state and the gradients":
        "优化器状态和梯度",
    "the optimizer state, the gradients and the weights":
        "优化器状态、梯度和权重",
    (" That is 10⁹ times too few: gpu_gb is in GB, so the GPU holds gpu_gb × 10⁹ bytes, and the answer is a number of "
     "parameters, not billions."):
        "这少了 10⁹ 倍：gpu_gb 以 GB 为单位，所以 GPU 能装 gpu_gb × 10⁹ 字节，而答案是参数的个数，不是以十亿为单位的数。",
    " That is 10⁹ times too many: divide the GPU's bytes, gpu_gb × 10⁹, by the bytes per parameter.":
        "这多了 10⁹ 倍：用 GPU 的字节数 gpu_gb × 10⁹ 除以每个参数的字节数。",
    " You took a GB as 2³⁰ bytes (a GiB): a GPU's GB here, as in ZeRO's paper, is 10⁹ bytes.":
        "你把 1 GB 当成了 2³⁰ 字节（1 GiB）：这里 GPU 的 GB 与 ZeRO 论文中一样，是 10⁹ 字节。",
    (" You counted 4 bytes each for the weights and gradients: in mixed precision they are 2 each (bf16), and the "
     "fp32 copy is part of the K bytes of optimizer state."):
        "你给权重和梯度各算了 4 字节：混合精度下它们各占 2 字节（bf16），fp32 副本算在优化器状态的 K 字节里。",
    " That is for K = 12: this case has k={k} bytes of optimizer state per parameter.":
        "这是 K = 12 时的结果：这个用例每个参数有 k={k} 字节的优化器状态。",
    (" You sharded the weights instead of the gradients: stage 2 divides the gradients (grad_bytes={grad_bytes} each "
     "here) and the optimizer state over the n_d={n_d} GPUs; every GPU keeps its whole 2-byte weights until stage 3."):
        "你分片的是权重而不是梯度：阶段 2 把梯度（这里每个 grad_bytes={grad_bytes} 字节）和优化器状态分到 n_d={n_d} 个 GPU 上；直到阶段 3，"
        "每个 GPU 都保留完整的 2 字节权重。",
    " That is for 2-byte gradients: this case keeps them in fp32, grad_bytes={grad_bytes} bytes per parameter.":
        "这是 2 字节梯度时的结果：这个用例用 fp32 保存梯度，每个参数 grad_bytes={grad_bytes} 字节。",
    " That is what fits at stage {other}: stage {stage} shards {sharded} over the n_d={n_d} GPUs.":
        "这是阶段 {other} 下能放下的量：阶段 {stage} 把{sharded}分片到 n_d={n_d} 个 GPU 上。",
    " That is what fits at stage {other}: stage {stage} shards nothing, so n_d does not matter.":
        "这是阶段 {other} 下能放下的量：阶段 {stage} 什么都不分片，所以 n_d 不起作用。",
    " (in billions of parameters, e.g. 7 for a 7 B model)":
        "（以十亿个参数为单位，例如 7 B 的模型填 7）",
    ("{what} = {got!r:.12}: not the largest model that fits{hint}. How many bytes per parameter stay on one GPU, and "
     "how many bytes does it have?"):
        "{what} = {got!r:.12}：不是能放下的最大模型{hint}。每个参数有多少字节留在一个 GPU 上，这个 GPU 又有多少字节？",
    ("one 80 GB GPU holds the states of {one_gpu:.3g} B parameters; 64 with ZeRO-3, {zero3_64:.3g} B: ZeRO-3 "
     "multiplies it by N_d"):
        "一个 80 GB 的 GPU 能装下 {one_gpu:.3g} B 个参数的状态；64 个 GPU 用 ZeRO-3 能装下 {zero3_64:.3g} B：ZeRO-3 把它乘以 N_d",
    # -- ch02.py: recursive doubling, the crossover, and the two "think" questions
    "world_size={world_size}: recursive doubling needs a power of two (2, 4, 8 ranks)":
        "world_size={world_size}：递归倍增（recursive doubling）需要 2 的幂（2、4、8 个 rank）",
    "{fn} raised {error_type} on rank {rank} of {world_size}: {message}":
        "{fn} 在 rank {rank}（共 {world_size} 个）上抛出了 {error_type}：{message}",
    "{fn} on rank {rank} called {ops}: build the all-reduce from point-to-point messages (send/recv, isend/irecv)":
        "{fn} 在 rank {rank} 上调用了 {ops}：请用点对点消息（send/recv、isend/irecv）搭出 all-reduce",
    ("{fn} gives the right sums, but rank {rank} sent to ranks {peers}; in recursive doubling's step k rank r swaps "
     "with rank r XOR 2^k, so rank {rank} sends once to each of {partners}"):
        "{fn} 的求和结果正确，但 rank {rank} 发给了 rank {peers}；递归倍增的第 k 步中，rank r 与 rank r XOR 2^k 交换，"
        "所以 rank {rank} 应向 {partners} 中的每一个各发送一次",
    ("{fn} gives the right sums, but rank {rank} sent {sent} bytes to rank {peer}; recursive doubling sends the whole "
     "{buffer}-byte buffer in every step, log₂ {world_size} = {steps} steps: {total} bytes"):
        "{fn} 的求和结果正确，但 rank {rank} 向 rank {peer} 发送了 {sent} 字节；递归倍增每一步都发送整个 {buffer} 字节的缓冲区，"
        "共 log₂ {world_size} = {steps} 步：{total} 字节",
    ("{fn} gives the right sums here, but rank {rank} wrote into the buffer it was sending to rank {peer} before that "
     "isend was waited on: the send may still be reading it (gloo copied it in time on this machine; NCCL reads it "
     "while it runs). Send a copy, or wait for the send before adding."):
        "{fn} 在这里的求和结果正确，但 rank {rank} 在发往 rank {peer} 的 isend 被等待完成之前，就往正在发送的缓冲区里写入了：发送可能仍在读取它（在这台机器上 gloo 及时复制了它；"
        "NCCL 则在运行期间读取它）。请发送一份副本，或者等发送完成后再相加。",
    ("{fn} matches dist.all_reduce on {world_size} ranks, each rank swapping its whole buffer with rank XOR 2^k in "
     "step k: log₂ n × buffer = {total} bytes per rank"):
        "{fn} 在 {world_size} 个 rank 上与 dist.all_reduce 一致，第 k 步中每个 rank 都与 rank XOR 2^k 交换整个缓冲区："
        "每个 rank 发送 log₂ n × 缓冲区 = {total} 字节",
    "the exercise asks for the crossover worked out from the two algorithms' costs, not the check's own answer":
        "这道练习要的是由两种算法的开销推出的交叉点，而不是检查自带的答案",
    "isend may still be reading the buffer when you add into it, so the partner could receive a partly summed buffer":
        "你往缓冲区里累加时，isend 可能仍在读取它，于是对方可能收到一个只加了一部分的缓冲区",
    "gloo and NCCL cannot send the same tensor twice":
        "gloo 和 NCCL 不能把同一个张量发送两次",
    "They can: a tensor may be sent any number of times; what matters is when it is read.":
        "它们可以：一个张量可以发送任意多次；关键在于它何时被读取。",
    "the partner's sum would count your values twice, because tensors are shared between ranks":
        "对方的和会把你的值算两次，因为张量在 rank 之间是共享的",
    "Ranks are separate processes: a send copies bytes, nothing is shared between them.":
        "各个 rank 是独立的进程：发送会复制字节，它们之间不共享任何东西。",
    "Below the crossover latency dominates: the ring pays 2(n−1) latencies, recursive doubling only log₂ n.":
        "在交叉点以下，延迟占主导：ring 要付出 2(n−1) 次延迟，递归倍增只要 log₂ n 次。",
    "the ring":
        "ring",
    "recursive doubling: log₂ n latencies instead of 2(n−1)":
        "递归倍增：log₂ n 次延迟，而不是 2(n−1) 次",
    "Why send a copy":
        "为什么要发送副本",
    "Below the crossover":
        "交叉点以下",
}
