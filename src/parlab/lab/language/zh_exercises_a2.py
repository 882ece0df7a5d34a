"""Chinese templates of the course's messages (:mod:`parlab.lab.language`): the exercise checks of
chapters 03 to 05 (``ch03.py`` … ``ch05.py``). Each English template as the code says it, its Chinese with the same ``{placeholders}`` (format specs
included). Terms follow the edition's glossary: rank, world size, the collectives' names, APIs, arguments and
printed values stay English."""

MESSAGES: dict[str, str] = {
    # -- ch03.py: the weighted average, DDP's buckets, v3's early buckets
    ".grad is {got}, expected shape {shape}":
        ".grad 是 {got}，应为形状 {shape}",
    ("every rank weighs the same, but they hold {sizes} examples: a rank's mean gradient counts as many times as it "
     "has examples"):
        "每个 rank 占的比重都一样，但它们分别持有 {sizes} 个样本：一个 rank 的平均梯度应按它的样本数计入",
    ".grad is unchanged: nothing was combined with the other ranks":
        ".grad 没有变：没有与其他 rank 合并任何东西",
    (".grad points the right way but is {scale:.3g} times the global mean's: divide by the number of examples all "
     "ranks hold together, which only the ranks' local_batch_size summed tells (not a batch size assumed the same on "
     "every rank)"):
        ".grad 方向正确，但大小是全局平均的 {scale:.3g} 倍：应除以所有 rank 合起来持有的样本数，"
        "这个数只能由各 rank 的 local_batch_size 求和得到（而不是假定每个 rank 的批次大小都相同）",
    ".grad differs from the gradient of the global mean loss by up to {most:.3g}":
        ".grad 与全局平均损失的梯度最多相差 {most:.3g}",
    "every parameter: {problem}":
        "所有参数：{problem}",
    "{names}: {problem}":
        "{names}：{problem}",
    "fn must be a function weighted_average(params, local_batch_size); got {fn!r}":
        "fn 应是函数 weighted_average(params, local_batch_size)；实际为 {fn!r}",
    "world_size must be an int >= 2; got {world_size!r}":
        "world_size 应是 >= 2 的 int；实际为 {world_size!r}",
    "every rank: {finding}":
        "所有 rank：{finding}",
    "rank {ranks}: {finding}":
        "rank {ranks}：{finding}",
    "{fn} is not right yet:":
        "{fn} 还不对：",
    "every gradient on {world_size} ranks holding {sizes} examples is the global mean's":
        "在分别持有 {sizes} 个样本的 {world_size} 个 rank 上，每个梯度都是全局平均损失的梯度",
    "the exercise asks for DDP's rule applied by you, not the package's bucket layout":
        "这道练习要你自己应用 DDP 的规则，而不是用本包的桶布局",
    "{fn}(ready_bytes, bucket_cap_mb={cap}) returned {got!r:.60}: return a list of the bytes of each bucket":
        "{fn}(ready_bytes, bucket_cap_mb={cap}) 返回了 {got!r:.60}：请返回由每个桶的字节数组成的 list",
    "DDP counts bucket_cap_mb in MiB, 2²⁰ = 1,048,576 bytes (int(bucket_cap_mb * 1024 * 1024))":
        "DDP 以 MiB 计 bucket_cap_mb，即 2²⁰ = 1,048,576 字节（int(bucket_cap_mb * 1024 * 1024)）",
    "a bucket closes once it holds the limit or more (>=), so a bucket of exactly the limit closes":
        "桶一旦装到上限或更多（>=）就关闭，所以恰好等于上限的桶也会关闭",
    "You read bucket_cap_mb's MB as 10⁶ bytes: {unit}.":
        "你把 bucket_cap_mb 的 MB 当成了 10⁶ 字节：{unit}。",
    "You close a bucket only above the limit (>): {edge}.":
        "你只在超过上限（>）时才关闭桶：{edge}。",
    "You read bucket_cap_mb's MB as 10⁶ bytes ({unit}), and you close a bucket only above the limit (>): {edge}.":
        "你把 bucket_cap_mb 的 MB 当成了 10⁶ 字节（{unit}），并且只在超过上限（>）时才关闭桶：{edge}。",
    ("Only at DDP's default cap (bucket_cap_mb=None) is the first bucket's limit 1 MiB; a cap you pass applies to "
     "every bucket."):
        "只有在 DDP 的默认上限（bucket_cap_mb=None）下，第一个桶的上限才是 1 MiB；你传入的上限适用于每一个桶。",
    ("At DDP's default cap (bucket_cap_mb=None) the first bucket closes at 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES), "
     "the later ones at 25 MiB."):
        "在 DDP 的默认上限（bucket_cap_mb=None）下，第一个桶在 1 MiB 时关闭（dist._DEFAULT_FIRST_BUCKET_BYTES），之后的桶在 25 MiB 时关闭。",
    ("DDP adds a gradient to the open bucket first and then closes it if it holds the limit or more: a bucket may end "
     "above the limit."):
        "DDP 先把梯度加入当前打开的桶，然后若桶装到上限或更多就关闭它：一个桶最终可能超过上限。",
    " {hint}":
        "{hint}",
    ("{fn}(ready_bytes, bucket_cap_mb={cap}) = {got}; DDP built {real} from gradients of {ready} bytes, in that "
     "order.{hint}"):
        "{fn}(ready_bytes, bucket_cap_mb={cap}) = {got}；对依次为 {ready} 字节的梯度，DDP 建出的是 {real}。{hint}",
    ("{fn}(ready_bytes, bucket_cap_mb={cap}) = {got}; DDP's rule gives {want} for gradients of {ready} bytes, in that "
     "order.{hint}"):
        "{fn}(ready_bytes, bucket_cap_mb={cap}) = {got}；对依次为 {ready} 字节的梯度，DDP 的规则给出 {want}。{hint}",
    "{fn} predicts DDP's rebuilt buckets at the default cap and at 0.5 MiB, and on fresh gradient sizes":
        "{fn} 在默认上限和 0.5 MiB 下，以及在新抽取的梯度大小上，都预测对了 DDP 重建的桶",
    "answers must be a dict with the keys {keys} (bucket_bytes), each holding (buckets, early); got {answers!r:.120}":
        "answers 应是以 {keys}（bucket_bytes）为键的 dict，每个值为 (buckets, early)；实际为 {answers!r:.120}",
    "answers[{bucket_bytes}] must be (buckets, early); got {got!r}":
        "answers[{bucket_bytes}] 应为 (buckets, early)；实际为 {got!r}",
    ("bucket_bytes={bucket_bytes}: you said {buckets} buckets; v3 builds a different number (rerun section 5 with "
     "this bucket_bytes and read len(v3[0]['buckets']))"):
        "bucket_bytes={bucket_bytes}：你说有 {buckets} 个桶；v3 建出的数目不同（用这个 bucket_bytes 重新运行第 5 节，"
        "然后读 len(v3[0]['buckets'])）",
    ("bucket_bytes={bucket_bytes}: {early} of {buckets} buckets starting early is not what v3 does: a bucket starts "
     "once its own gradients and every earlier bucket's are in; which bucket holds the last gradient backward "
     "produces?"):
        "bucket_bytes={bucket_bytes}：{buckets} 个桶中有 {early} 个提前开始，这不是 v3 的做法：一个桶要等它自己的梯度和之前所有桶的梯度都就绪才开始；"
        "反向传播产生的最后一个梯度在哪个桶里？",
    ("right for bucket_bytes {small} and {large}: with one bucket nothing can go before backward's last gradient, so "
     "nothing overlaps"):
        "bucket_bytes 为 {small} 和 {large} 时都对了：只有一个桶时，没有什么能在反向传播的最后一个梯度之前开始，所以没有任何重叠",
    # -- ch04.py: reduce to owners, stage 3's gathered peak, accumulation volumes, the block kept gathered
    "write it with dist.reduce, not with the check's own reference":
        "请用 dist.reduce 来写，而不是用检查自带的参考实现",
    ("{numel}-element gradient: no communication was recorded on the process group: every rank's shard needs the "
     "other ranks' gradients (one dist.reduce per owner)"):
        "{numel} 个元素的梯度：进程组上没有记录到任何通信：每个 rank 的分片都需要其他 rank 的梯度（每个所有者一次 dist.reduce）",
    ("{numel}-element gradient: the reduces had roots {roots}; each of the {n} ranks owns one shard, so each is the "
     "root (dst) of exactly one reduce"):
        "{numel} 个元素的梯度：这些 reduce 的根是 {roots}；{n} 个 rank 各拥有一个分片，所以每个 rank 恰好是一次 reduce 的根（dst）",
    ("{numel}-element gradient: the reduces sent {sizes} bytes, {sent} in all, but an owner needs only its shard, "
     "{shard} elements ({shard_bytes} bytes). Reducing the whole buffer to every owner moves {times:.3g}× the traffic "
     "of a reduce-scatter: reduce only chunk k of the padded buffer to owner k"):
        "{numel} 个元素的梯度：这些 reduce 发送了 {sizes} 字节，共 {sent} 字节，但所有者只需要它的分片，即 {shard} 个元素（{shard_bytes} 字节）。"
        "把整个缓冲区 reduce 给每个所有者，通信量是 reduce-scatter 的 {times:.3g} 倍：只把填充后缓冲区的第 k 块 reduce 给所有者 k",
    ": every rank's shard has ⌈{numel}/{n}⌉ = {shard} elements (pad the gradient with zeros to {padded} first)":
        "：每个 rank 的分片有 ⌈{numel}/{n}⌉ = {shard} 个元素（先用零把梯度填充到 {padded} 个元素）",
    ": that is the sum over ranks; the optimizer needs the average":
        "：这是各 rank 的和；优化器需要的是平均值",
    "{numel}-element gradient: {problem}":
        "{numel} 个元素的梯度：{problem}",
    "fn must be the function you wrote; got {kind}":
        "fn 应是你写的函数；实际为 {kind}",
    "rank {rank}: {finding}":
        "rank {rank}：{finding}",
    "not right yet:":
        "还不对：",
    ("right values, but through {ops}: build it from dist.reduce alone (the point is that a reduce-scatter is N "
     "reduces, each rank the root of one)"):
        "值是对的，但用到了 {ops}：请只用 dist.reduce 来搭（要点在于：一次 reduce-scatter 就是 N 次 reduce，每个 rank 做其中一次的根）",
    "every rank holds its shard of the average on {world_size} ranks, for {sizes} gradient sizes, from reduces alone":
        "在 {world_size} 个 rank 上、对 {sizes} 种梯度大小，每个 rank 都只靠 reduce 得到了平均值中属于自己的分片",
    ": {once}":
        "：{once}",
    "each group is gathered into its own padded buffer: pad every block and the root on its own, then add":
        "每一组都被收集到它自己的填充后缓冲区：先把每个块和 root 各自填充，再相加",
    "no padding: the sizes need padding to a multiple of world_size first":
        "没有填充：这些大小要先填充到 world_size 的倍数",
    "padded to a multiple of world_size + 1: pad to a multiple of world_size itself":
        "填充到了 world_size + 1 的倍数：应填充到 world_size 本身的倍数",
    "padded to a multiple of world_size − 1: pad to a multiple of world_size itself":
        "填充到了 world_size − 1 的倍数：应填充到 world_size 本身的倍数",
    ("that is the peak without prefetch: prefetch gathers the next block while this one computes, so two neighbours "
     "are held at once"):
        "这是不预取时的峰值：预取会在当前块计算时收集下一个块，所以同时持有两个相邻的块",
    "that is the peak with prefetch: without it, one block at a time":
        "这是预取时的峰值：不预取时，一次只持有一个块",
    ("the root is unpadded: the root's weights are gathered into a padded buffer too, so pad root_numel to a multiple "
     "of world_size"):
        "root 没有填充：root 的权重也被收集到填充后的缓冲区里，所以要把 root_numel 填充到 world_size 的倍数",
    ("the root is forgotten: the root's weights (the embeddings and final norm) stay gathered through the whole "
     "forward and backward; add them"):
        "漏掉了 root：root 的权重（嵌入层和最后的归一化层）在整个前向和反向传播中都保持收集状态；把它们加上",
    "padding applied once, to the two blocks together":
        "只填充了一次，而且是对两个块合起来填充",
    "padding applied once, to the total":
        "只填充了一次，而且是对总数填充",
    "padding applied once, to the root and blocks together":
        "只填充了一次，而且是对 root 和块合起来填充",
    "that counts one rank's shards: a gathered buffer holds the whole block, every rank's shard":
        "这只算了一个 rank 的分片：收集后的缓冲区装着整个块，即每个 rank 的分片",
    "the root counted as one rank's shard: the root is gathered whole too":
        "把 root 算成了一个 rank 的分片：root 也是被完整收集的",
    "rounded down: padding rounds each size *up* to a multiple of world_size (⌈numel / N⌉ · N)":
        "向下取整了：填充是把每个大小*向上*取整到 world_size 的倍数（⌈numel / N⌉ · N）",
    ("the largest block counted twice: prefetch holds a block and the *next* one, in forward order, not two copies of "
     "the largest"):
        "把最大的块算了两次：预取持有的是一个块和前向顺序中的*下一个*块，而不是最大块的两份",
    ("the two largest blocks: prefetch holds a block and the next one in forward order, which need not be the two "
     "largest"):
        "取了最大的两个块：预取持有的是一个块和前向顺序中的下一个块，它们不一定是最大的两个",
    "three blocks at once: the previous block is freed after its forward, before the next is gathered":
        "同时持有三个块：前一个块在它的前向结束后、下一个块被收集之前就已释放",
    "every block at once: stage 3 frees each block after it computes":
        "同时持有所有块：阶段 3 在每个块计算完后就释放它",
    " ({hints})":
        "（{hints}）",
    "; or ":
        "；或者",
    "work it out from the order stage 3 gathers and frees, not with the check's own reference":
        "请根据阶段 3 收集和释放的顺序推出来，而不是用检查自带的参考实现",
    ("fn(block_numels={blocks}, root_numel={root}, prefetch={prefetch}, world_size={n}): expected {expected}, got "
     "{got!r}{hint}"):
        "fn(block_numels={blocks}, root_numel={root}, prefetch={prefetch}, world_size={n})：应为 {expected}，"
        "实际为 {got!r}{hint}",
    "fn agrees with the reference on all {cases} cases, {drawn} of them drawn anew":
        "fn 在全部 {cases} 个用例上与参考实现一致，其中 {drawn} 个是新抽取的",
    ("stage 3 has no all-gather after the step: each rank updates its own shard of the weights, and the next forward "
     "gathers them"):
        "阶段 3 在优化器 step 之后没有 all-gather：每个 rank 更新自己那份权重分片，由下一次前向传播再收集它们",
    "with no_sync, DDP all-reduces only after the last micro-batch; the gradients accumulate locally before it":
        "使用 no_sync 时，DDP 只在最后一个微批次之后做 all-reduce；在此之前梯度在本地累积",
    "an all-reduce moves 2Ψ per rank (a reduce-scatter, then an all-gather, Ψ each)":
        "一次 all-reduce 每个 rank 传输 2Ψ（先 reduce-scatter，再 all-gather，各 Ψ）",
    ("stage 1 keeps whole gradients, so they accumulate locally: one reduce-scatter and one all-gather per step, as "
     "DDP"):
        "阶段 1 保留完整的梯度，所以梯度在本地累积：每个 step 一次 reduce-scatter 和一次 all-gather，与 DDP 一样",
    ("stage 1 keeps whole gradients (it shards only the optimizer state), so they accumulate locally and are "
     "reduce-scattered once, before the step"):
        "阶段 1 保留完整的梯度（它只对优化器状态分片），所以梯度在本地累积，并在 step 之前 reduce-scatter 一次",
    "the all-gather is missing: after the step every rank all-gathers the updated weights (Ψ)":
        "漏掉了 all-gather：step 之后每个 rank 都要 all-gather 更新后的权重（Ψ）",
    ("that counts stage 2 as stage 1, whose whole gradients accumulate locally. Stage 2 keeps only its shard of the "
     "gradients, so where does the next micro-batch's gradient go before the step? Each is reduce-scattered during "
     "its own backward"):
        "这把阶段 2 当成了阶段 1，后者的完整梯度在本地累积。阶段 2 只保留自己那份梯度分片，那么 step 之前，下一个微批次的梯度放在哪里？每个微批次的梯度都在它自己的反向传播中 reduce-scatter",
    "the updated weights are all-gathered once, after the step, not after every micro-batch":
        "更新后的权重只在 step 之后 all-gather 一次，而不是每个微批次之后都做",
    "the all-gather is missing: after the step every rank all-gathers the updated weights (Ψ), once":
        "漏掉了 all-gather：step 之后每个 rank 都要 all-gather 一次更新后的权重（Ψ）",
    ("that counts one micro-batch: does every micro-batch's forward find the weights gathered? Stage 3 frees them "
     "after each block, so every micro-batch's forward and backward gather them again, and every backward "
     "reduce-scatters"):
        "这只算了一个微批次：每个微批次的前向传播都能找到已收集的权重吗？阶段 3 在每个块之后释放它们，所以每个微批次的前向和反向都要重新收集，并且每次反向都要 reduce-scatter",
    "stage 3 keeps only its shard of the gradients, as stage 2: every micro-batch's backward reduce-scatters (Ψ each)":
        "阶段 3 与阶段 2 一样只保留自己那份梯度分片：每个微批次的反向传播都要 reduce-scatter（各 Ψ）",
    ("stage 3 frees the weights after each block's forward, so backward gathers them again: two gathers per "
     "micro-batch, and a reduce-scatter"):
        "阶段 3 在每个块的前向之后释放权重，所以反向时要重新收集：每个微批次两次收集，外加一次 reduce-scatter",
    ("that counts one micro-batch: does every micro-batch's forward find the weights gathered? They are freed after "
     "each backward, so every micro-batch's forward gathers them again, and every backward reduce-scatters"):
        "这只算了一个微批次：每个微批次的前向传播都能找到已收集的权重吗？它们在每次反向之后被释放，所以每个微批次的前向都要重新收集，并且每次反向都要 reduce-scatter",
    ("reshard_after_forward=False keeps the weights gathered from forward into backward: one gather per micro-batch, "
     "not two"):
        "reshard_after_forward=False 让权重从前向到反向一直保持收集状态：每个微批次收集一次，而不是两次",
    ("reshard_after_forward=False keeps a block from its forward to its backward, not from one micro-batch to the "
     "next: each micro-batch gathers again"):
        "reshard_after_forward=False 让一个块从它的前向保留到它的反向，而不是从一个微批次保留到下一个：每个微批次都要重新收集",
    ": return a number, the volume in units of Ψ (one model's worth of values per rank)":
        "：请返回一个数，即以 Ψ 为单位的通信量（每个 rank 一个模型大小的值）",
    ": {hints}":
        "：{hints}",
    "count the collectives yourself, not with the planner or the check's own answer":
        "请自己数出集合通信操作，而不是用规划器或检查自带的答案",
    "fn({strategy!r}, micro_batches={m}): expected {expected}Ψ, got {got!r}{hint}":
        "fn({strategy!r}, micro_batches={m})：应为 {expected}Ψ，实际为 {got!r}{hint}",
    "the volumes of all {strategies} strategies, for 1 to 8 micro-batches, are right":
        "全部 {strategies} 种策略在 1 到 8 个微批次下的通信量都对了",
    "block={block!r}: give an index into model.transformer.h, 0 to {last} (or -1 for the last, as Python counts)":
        "block={block!r}：请给出 model.transformer.h 中的下标，0 到 {last}（或者像 Python 那样用 -1 表示最后一个）",
    ("every block's backward gathers its weights again; which one's backward comes first, right after the forward has "
     "used it?"):
        "每个块的反向传播都会重新收集它的权重；哪个块的反向最先到来，紧接在前向用过它之后？",
    "block {block!r} (block {index}): {question}":
        "块 {block!r}（即块 {index}）：{question}",
    "block {block!r}: {question}":
        "块 {block!r}：{question}",
    "the block's bytes unpadded; the gathered buffer is padded to a multiple of world_size":
        "块未填充时的字节数；收集后的缓冲区会填充到 world_size 的倍数",
    "two gathers; only one gather is skipped, the one before its backward":
        "两次收集；只省掉了一次收集，即它反向之前的那一次",
    "the gathered buffer's elements; bytes_saved is in bytes, and the weights are fp32 (4 bytes each)":
        "收集后缓冲区的元素数；bytes_saved 以字节计，而权重是 fp32（每个 4 字节）",
    ("one rank's shard in bytes; the all-gather fills the whole gathered buffer, all {world_size} shards (this rank's "
     "own included)"):
        "一个 rank 的分片的字节数；all-gather 会填满整个收集后的缓冲区，即全部 {world_size} 个分片（包括本 rank 自己的）",
    "one rank's shard in elements; count the whole gathered buffer, in bytes (fp32: 4 each)":
        "一个 rank 的分片的元素数；应按字节计整个收集后的缓冲区（fp32：每个 4 字节）",
    "what the other ranks send; count the whole gathered buffer, this rank's own shard included":
        "其他 rank 发来的部分；应计整个收集后的缓冲区，包括本 rank 自己的分片",
    "the buffer in 2-byte values; ZeroStage3 here is fp32: 4 bytes each":
        "按 2 字节的值计的缓冲区；这里的 ZeroStage3 是 fp32：每个 4 字节",
    " (that is {hints})":
        "（这是{hints}）",
    "block {block} is right; bytes_saved={bytes_saved!r} is not{hint}":
        "块 {block} 是对的；bytes_saved={bytes_saved!r} 不对{hint}",
    ("keep block {block} (backward starts with it): {saved:,} B less all-gather per step, for one block's weights "
     "held a little longer"):
        "保留块 {block}（反向从它开始）：每个 step 少 {saved:,} B 的 all-gather，代价是一个块的权重多保留一会儿",
    # -- ch05.py: the row-parallel forward, where the collectives go, sequence parallelism's costs
    "row_parallel_forward is not written yet (it raises NotImplementedError)":
        "row_parallel_forward 还没有写（它抛出 NotImplementedError）",
    "row_parallel_forward returned {kind}; return the layer's output":
        "row_parallel_forward 返回了 {kind}；请返回该层的输出",
    ("row_parallel_forward called the layer's own forward (the package's answer): write it from layer.weight, "
     "layer.bias and layer.comm"):
        "row_parallel_forward 调用了该层自己的 forward（本包的答案）：请用 layer.weight、layer.bias 和 layer.comm 来写",
    "the output has shape {shape}; expected (batch, out_features) = {expected}":
        "输出的形状是 {shape}；应为 (batch, out_features) = {expected}",
    "the output is this rank's partial sum: the ranks' results were never added up":
        "输出是本 rank 的部分和：各 rank 的结果从未被加起来",
    "the bias was added on every rank before the sum, so it counts {t} times":
        "偏置在求和之前就在每个 rank 上加了，所以它被算了 {t} 次",
    "the bias is missing":
        "漏掉了偏置",
    ("the output is the ranks' partial sums divided by t = {t}: an average, as data parallelism averages gradients. "
     "Here each rank's X_r·A_r is one term of a single sum: add them, do not divide by t"):
        "输出是各 rank 的部分和除以 t = {t}：这是平均值，就像数据并行对梯度求平均。这里每个 rank 的 X_r·A_r 是同一个和中的一项：把它们加起来，不要除以 t",
    "the output differs from the dense layer's by up to {most:.3g}":
        "输出与稠密层的输出最多相差 {most:.3g}",
    "expected one all-reduce of the output; the collectives were {ops}":
        "应对输出做一次 all-reduce；实际的集合通信操作是 {ops}",
    "the output does not require grad: autograd cannot train through it":
        "输出不需要梯度（没有 requires_grad）：autograd 无法通过它训练",
    "no gradient reached {name}":
        "没有梯度到达 {name}",
    ("the output is right, but the bias's gradient is 1/{t} of the dense layer's: the bias was divided by t and added "
     "on every rank before the sum, so each rank's copy learns {t} times too slowly. Add the whole bias once, after "
     "the sum"):
        "输出是对的，但偏置的梯度是稠密层的 1/{t}：偏置被除以 t，并在求和之前加到了每个 rank 上，所以每个 rank 上的副本学得慢了 {t} 倍。应在求和之后把完整的偏置加一次",
    "the gradient of {name} is 1/{t} of the dense layer's: something divides by t that should not":
        "{name} 的梯度是稠密层的 1/{t}：有个地方不该除以 t 却除了",
    ("the gradient of x is {t} times too large: the collective's backward summed gradients that every rank already "
     "holds whole (g's backward is the identity)"):
        "x 的梯度大了 {t} 倍：集合通信的反向把每个 rank 已经完整持有的梯度又求和了一遍（g 的反向是恒等映射）",
    "the gradient of {name} is wrong (up to {most:.3g} off)":
        "{name} 的梯度不对（最多相差 {most:.3g}）",
    ("the result is right, but the all-reduce is one autograd cannot see (an in-place torch.distributed collective): "
     "PyTorch lets the gradient through unchanged and warns that this is deprecated; use the package's operator for "
     "it, so that backward is the one you chose"):
        "结果是对的，但这次 all-reduce 是 autograd 看不到的（一个原地的 torch.distributed 集合通信）：PyTorch 会原样放过梯度，并警告这种用法已弃用；请用本包的算子来做，"
        "这样反向才是你选的那一个",
    "fn must be a function row_parallel_forward(layer, x); got {kind}":
        "fn 应是函数 row_parallel_forward(layer, x)；实际为 {kind}",
    "world_size must be an int >= 2 dividing {features}; got {world_size!r}":
        "world_size 应是能整除 {features} 且 >= 2 的 int；实际为 {world_size!r}",
    "row_parallel_forward on rank {rank} of {world_size}: {problem}":
        "row_parallel_forward 在 rank {rank}（共 {world_size} 个）上：{problem}",
    "the row-parallel layer matches the dense one on {world_size} ranks, output and gradients, with one all-reduce":
        "行并行层在 {world_size} 个 rank 上与稠密层一致，输出和梯度都对，且只用了一次 all-reduce",
    "work out what each rank holds at each boundary, and what the next layer needs":
        "请推出每个边界处各 rank 持有什么，以及下一层需要什么",
    "fn must be a function tp_collectives(splits); got {kind}":
        "fn 应是函数 tp_collectives(splits)；实际为 {kind}",
    "tp_collectives is not written yet (it raises NotImplementedError)":
        "tp_collectives 还没有写（它抛出 NotImplementedError）",
    ("tp_collectives({splits}) returned {got!r}: expected a list of {ops} ops, one per boundary (before the first "
     "layer, between layers, after the last)"):
        "tp_collectives({splits}) 返回了 {got!r}：应是由 {ops} 个操作组成的 list，每个边界一个（第一层之前、各层之间、最后一层之后）",
    "tp_collectives({splits})[{i}] = {got!r} is not one of {ops}":
        "tp_collectives({splits})[{i}] = {got!r} 不是 {ops} 中的一个",
    "after the last layer":
        "在最后一层之后",
    "before the first layer":
        "在第一层之前",
    "between {before} and {after}":
        "在 {before} 和 {after} 之间",
    "its slice of the features":
        "它那一份特征",
    "the whole tensor":
        "完整的张量",
    "a partial sum":
        "部分和",
    ("tp_collectives({splits}): {where} you said {got!r}, but there each rank holds {held} and what follows needs "
     "{need}"):
        "tp_collectives({splits})：{where}你给的是 {got!r}，但那里每个 rank 持有的是{held}，而后面需要的是{need}",
    "tp_collectives agrees with the reference on all {cases} chains, 3 of them drawn anew":
        "tp_collectives 在全部 {cases} 条链上与参考实现一致，其中 3 条是新抽取的",
    "the LayerNorm's weights are split across the ranks, so each holds a slice of the gradient":
        "LayerNorm 的权重被切分到各 rank 上，所以每个 rank 持有梯度的一部分",
    "Every rank holds the whole LayerNorm weight (it is replicated, not split); what differs is the input.":
        "每个 rank 都持有完整的 LayerNorm 权重（它是复制的，而不是切分的）；不同的是输入。",
    "each rank's LayerNorm sees only its s/t tokens, so its gradient is a partial sum over the tokens":
        "每个 rank 的 LayerNorm 只看到自己的 s/t 个 token，所以它的梯度是对 token 的部分和",
    "the all-gather before the column-parallel layer changes the LayerNorm's gradient":
        "列并行层之前的 all-gather 改变了 LayerNorm 的梯度",
    ("The all-gather's backward is a reduce-scatter of the activation gradient; it does not touch the weight "
     "gradient's sum over tokens."):
        "all-gather 的反向是对激活值梯度的 reduce-scatter；它不影响权重梯度对 token 的求和。",
    "f is the identity forward: its all-reduce runs only in backward":
        "f 在前向是恒等映射：它的 all-reduce 只在反向时运行",
    "PyTorch fuses the separate f's of Q, K and V into one all-reduce forward":
        "PyTorch 把 Q、K、V 各自的 f 在前向融合成一次 all-reduce",
    "Nothing is fused: count the forward collectives a single f adds first.":
        "没有任何融合：先数一数单个 f 在前向增加了几次集合通信。",
    "the literal plan splits Q, K and V by rows, which needs no forward all-reduce":
        "按字面的方案按行切分 Q、K 和 V，因而前向不需要 all-reduce",
    "The literal plan splits Q, K and V by columns (colwise), like Megatron's.":
        "按字面的方案按列（colwise）切分 Q、K 和 V，与 Megatron 的一样。",
    "saved_and_gathers must be a function (batch, seq_len, hidden, tp_size) -> (bytes, count)":
        "saved_and_gathers 应是函数 (batch, seq_len, hidden, tp_size) -> (bytes, count)",
    "the exercise asks for the bytes worked out yourself, not the check's own answer":
        "这道练习要你自己算出字节数，而不是用检查自带的答案",
    "{fn}({args}) returned {got!r:.60}: return (bytes, all-gathers)":
        "{fn}({args}) 返回了 {got!r:.60}：请返回 (bytes, all-gathers)",
    (" (half of it: the values are fp32, 4 bytes each, and GPT-2's layer has two column-parallel inputs, c_attn's and "
     "c_fc's)"):
        "（这是一半：值是 fp32，每个 4 字节，而且 GPT-2 的层有两个列并行层的输入，即 c_attn 和 c_fc 的）",
    " (each rank keeps s/t of the tokens: it saves (t − 1)/t of each)":
        "（每个 rank 保留 s/t 的 token：每个输入省下 (t − 1)/t）",
    (" (that is {t} times too much, multiplied by t = tp_size: seq_len is the whole sequence, so a gathered input is "
     "batch·seq_len·hidden values and each rank's chunk 1/t of it; you counted as if seq_len were the chunk, and "
     "saved (t − 1) chunks of it)"):
        "（这多了 {t} 倍，即乘了 t = tp_size：seq_len 是整个序列，所以一个收集后的输入有 batch·seq_len·hidden 个值，每个 rank 的块是它的 1/t；"
        "你把 seq_len 当成了块来算，省下了 (t − 1) 个这样的块）",
    "{fn}({args}): {got!r} bytes saved; expected {expected:,}{hint}":
        "{fn}({args})：省下 {got!r} 字节；应为 {expected:,}{hint}",
    ("{fn}({args}): {got!r} all-gathers added per layer; each gathered input is gathered again once in backward: "
     "expected {expected}"):
        "{fn}({args})：每层增加 {got!r} 次 all-gather；每个收集后的输入在反向时会再收集一次：应为 {expected}",
    "(b) norms":
        "(b) 归一化层",
    "(c) literal":
        "(c) 按字面的方案",
    "sequence parallelism's costs: the bytes saved, the all-gathers added, and both reasons":
        "序列并行的代价：省下的字节、增加的 all-gather，以及两个原因",
}
