"""Chinese templates of the course's messages (:mod:`parlab.lab.language`): English template → 中文.

The exercise checks of chapters 06–08 (``parlab.course.exercises.ch06`` … ``ch08``); 09 and 10 in ``zh_exercises_b2``."""

MESSAGES: dict[str, str] = {
    # -- chapter 06: pipeline schedules -------------------------------------------------------------------
    "the exercise asks for 1F1B's order written out, without parlab.lab.parallel.pipeline_schedule's schedules: "
    "count the warm-up forwards first":
        "本练习要你写出 1F1B 的顺序，不用 parlab.lab.parallel.pipeline_schedule 的调度：先数预热阶段的前向",
    "stage {stage} of {p}, {m} micro-batches": "{p} 个阶段中的阶段 {stage}，{m} 个微批次",
    "stage {stage} of {p}, {m} micro-batch": "{p} 个阶段中的阶段 {stage}，{m} 个微批次",
    "{fn}({where}): expected a list of names like 'F0', got {got!r:.80}":
        "{fn}（{where}）：应返回由 'F0' 这类名字组成的列表，得到 {got!r:.80}",
    "nothing (the list ends)": "什么都没有（列表已结束）",
    "nothing (the list should end)": "什么都没有（列表应当结束）",
    "{fn} for {where}: operation {i} should be {wanted}, got {said} (yours: {yours})":
        "{fn}（{where}）：第 {i} 个操作应为 {wanted}，得到 {said}（你的：{yours}）",
    "{fn} gives 1F1B's order for every stage of 1–6 stages and 1–9 micro-batches, and of 3 settings drawn anew "
    "({drawn})":
        "{fn} 对 1–6 个阶段、1–9 个微批次的每个阶段，以及新抽取的 3 组设置（{drawn}），都给出了 1F1B 的顺序",
    " (return a whole number of micro-batches, an int)": "（请返回微批次的整数个数，一个 int）",
    " (m={got} is no step at all: a step runs at least one micro-batch, so m ≥ 1; with p=1 there is no bubble, "
    "and m=1 meets any target)":
        "（m={got} 根本构不成一步：一步至少运行一个微批次，所以 m ≥ 1；p=1 时没有气泡，m=1 满足任何目标）",
    " (m={got} is no step at all: a step runs at least one micro-batch, so m ≥ 1; start counting at 1)":
        "（m={got} 根本构不成一步：一步至少运行一个微批次，所以 m ≥ 1；从 1 开始数）",
    "at m={expected} the bubble equals the target, and 'at most' includes it: compare with ≤, exactly (with "
    "fractions.Fraction or integers), not through floating point":
        "m={expected} 时气泡恰好等于目标，而“不超过”包括等于：用 ≤ 精确比较（用 fractions.Fraction 或整数），"
        "不要经过浮点数",
    "that is the m for (p − 1)/(v·m) ≤ target, the Playbook's and Megatron's bubble, relative to the ideal step; "
    "this exercise's is the idle share of the step, (p − 1)/(v·m + p − 1)":
        "那是满足 (p − 1)/(v·m) ≤ target 的 m，即 Playbook 和 Megatron 的气泡，相对于理想的一步；"
        "本练习的气泡是一步中空闲的占比，(p − 1)/(v·m + p − 1)",
    "that is the m for v=1: with v={v} stages per rank the bubble is (p − 1)/(v·m + p − 1)":
        "那是 v=1 时的 m：每个 rank 有 v={v} 个阶段时，气泡是 (p − 1)/(v·m + p − 1)",
    "with m={got} the bubble is still above the target: the smallest m whose bubble is at most the target":
        "m={got} 时气泡仍高于目标：要找的是气泡不超过目标的最小 m",
    " ({hints})": "（{hints}）",
    "; or ": "；或者",
    "the exercise asks for the bubble's inequality solved yourself, not the check's own answer":
        "本练习要你自己解出气泡的不等式，而不是借用检查自己的答案",
    " (with m={got} the bubble is {yours:.4f}; with m={expected}, {right:.4f})":
        "（m={got} 时气泡是 {yours:.4f}；m={expected} 时是 {right:.4f}）",
    "{fn}({args}): expected {expected}, got {got!r:.40}{numbers}{hint}":
        "{fn}({args})：应为 {expected}，得到 {got!r:.40}{numbers}{hint}",
    "{fn} finds the smallest m in all {count} cases": "{fn} 在全部 {count} 个用例中都找到了最小的 m",
    " (I frees nothing: the weight gradient W still needs the stage's saved inputs, so a split backward frees its "
    "micro-batch's activations at W)":
        "（I 什么也不释放：权重梯度 W 仍需要该阶段保存的输入，所以拆开的反向在 W 时才释放其微批次的激活值）",
    " (I and W are two halves of one backward: they free the activations once, at W)":
        "（I 和 W 是同一个反向的两半：它们只释放一次激活值，在 W 时）",
    " (a split backward frees too: at its W, once both halves have run)":
        "（拆开的反向也会释放：在它的 W 时，两半都运行完之后）",
    " (that counts every forward the stage runs: a backward frees its micro-batch's activations, so count what is "
    "held at once)":
        "（那数的是该阶段运行的所有前向：反向会释放其微批次的激活值，所以要数同一时刻保存了多少）",
    "the exercise asks you to count the activations yourself, without parlab.lab.parallel.pipeline_schedule's "
    "in_flight: which ops hold, which free?":
        "本练习要你自己数激活值，不用 parlab.lab.parallel.pipeline_schedule 的 in_flight：哪些操作保存，哪些释放？",
    "{fn}({ops}): expected {expected}, got {got!r:.40}{hint}": "{fn}({ops})：应为 {expected}，得到 {got!r:.40}{hint}",
    "{fn} agrees on all {count} operation lists": "{fn} 在全部 {count} 个操作列表上都一致",
    "each message costs a fixed time (chapter 02's α) while the operations shrink as m grows":
        "每条消息都有固定的耗时（第 02 章的 α），而操作随 m 增大而变短",
    "more micro-batches mean more activations to hold, and memory is slow":
        "微批次越多，要保存的激活值越多，而显存很慢",
    "1F1B holds at most p micro-batches' activations whatever m is: memory does not grow with m.":
        "无论 m 多大，1F1B 最多保存 p 个微批次的激活值：显存不随 m 增长。",
    "the formula (p − 1)/(m + p − 1) is wrong for large m": "公式 (p − 1)/(m + p − 1) 在 m 很大时是错的",
    "The simulator with comm=0 gives the formula exactly; what does comm=1 add to every boundary?":
        "comm=0 时模拟器给出的正是这个公式；comm=1 给每个边界添了什么？",
    "when the bubble saved is smaller than the time of the extra messages (v·p − 1 boundaries per micro-batch)":
        "当省下的气泡小于多出来的消息所花的时间时（每个微批次跨越 v·p − 1 个边界）",
    "never: a larger v always gives a shorter step": "永远不停：v 越大，一步总是越短",
    "The bubble shrinks with v, but each micro-batch crosses v·p − 1 boundaries: what do they cost?":
        "气泡随 v 缩小，但每个微批次要跨越 v·p − 1 个边界：它们要花多少时间？",
    "at v = 2, because PyTorch supports no more": "停在 v = 2，因为 PyTorch 不支持更多",
    "PyTorch's ScheduleInterleaved1F1B takes any number of stages per rank.":
        "PyTorch 的 ScheduleInterleaved1F1B 支持每个 rank 任意数量的阶段。",
    "{what}: {got!r:.40} is not what the simulator gives (within {tol}); run ps.simulate with those settings and "
    "read ps.bubble_fraction":
        "{what}：{got!r:.40} 不是模拟器给出的值（误差 {tol} 以内）；用这些设置运行 ps.simulate，再读 ps.bubble_fraction",
    "the bubble with comm=1": "comm=1 时的气泡",
    "why": "为什么",
    "messages that cost a forward each: the simulated bubble, and why small micro-batches pay":
        "每条消息耗时一个前向：模拟出的气泡，以及小微批次为何要付出代价",
    "the bubble at v={v}": "v={v} 时的气泡",
    "rank 0's peak at v={v}: {peak!r:.20} is not the simulator's (the widget prints it)":
        "v={v} 时 rank 0 的峰值：{peak!r:.20} 不是模拟器给出的值（小部件会打印它）",
    "where to stop": "在哪里停下",
    "interleaving: the bubble shrinks with v, rank 0 holds more stages' activations, and messages set the limit":
        "交错：气泡随 v 缩小，rank 0 要保存更多阶段的激活值，而消息决定了上限",

    # -- chapter 07: a mesh's groups, model states, choosing a layout -----------------------------------------
    "the exercise asks for the groups worked out from the axis order, without parlab.lab.parallel.Topology: what "
    "is the stride of each axis?":
        "本练习要你按轴的顺序推出各个组，不用 parlab.lab.parallel.Topology：每个轴的步长是多少？",
    "{fn}({args}): expected {expected}, got {got!r:.80}. {hint}": "{fn}({args})：应为 {expected}，得到 {got!r:.80}。{hint}",
    "{fn} finds all {count} groups of {meshes} meshes": "{fn} 找对了 {meshes} 个网格的全部 {count} 个组",
    "Every axis taken as blocks of consecutive ranks: only tp, the innermost axis, is contiguous. Ranks one step "
    "apart on an axis are its stride apart: dp's stride is the tp size, pp's tp × dp.":
        "把每个轴都当成了连续 rank 组成的块：只有最内层的 tp 轴是连续的。在一个轴上相邻的两个 rank 相隔该轴的步长："
        "dp 的步长是 tp 的大小，pp 的是 tp × dp。",
    "The axes in reverse order: pp is the outermost axis (largest stride), tp the innermost (stride 1).":
        "轴的顺序反了：pp 是最外层的轴（步长最大），tp 是最内层的（步长为 1）。",
    "Those are the coordinates along the axis (0 to size − 1), not the ranks that hold them.":
        "那是沿该轴的坐标（0 到 size − 1），不是持有这些坐标的 rank。",
    "The group includes the rank itself.": "组里也包括这个 rank 自己。",
    "Return a list of ranks (ints).": "请返回 rank 的列表（int）。",
    "A group is the ranks whose coordinates differ from rank's on this axis alone; an axis's stride is the product "
    "of the sizes of the axes inside it (tp innermost).":
        "一个组是只在这个轴上坐标与该 rank 不同的那些 rank；一个轴的步长是它内层各轴大小的乘积（tp 在最内层）。",
    "the exercise asks for the bytes counted yourself, without estimate_memory or the planner: bytes per parameter "
    "for weights, gradients, Adam; which are divided by what?":
        "本练习要你自己数字节数，不用 estimate_memory 或规划器：权重、梯度、Adam 每个参数各占几个字节？哪些要除以什么？",
    " (that is one number: the check compares each part, since two wrong parts can sum to the right total)":
        "（那是一个数：检查会逐项比较，因为两个错的部分加起来也可能等于正确的总数）",
    "{fn}({args}): expected a dict of bytes {{'params': ..., 'grads': ..., 'optimizer': ...}}, got {got!r:.80}"
    "{shape}":
        "{fn}({args})：应返回字节数的 dict {{'params': ..., 'grads': ..., 'optimizer': ...}}，得到 {got!r:.80}{shape}",
    "{fn}({args}): ": "{fn}({args})：",
    # "; " is in zh_launch (the launcher says it too)
    "{part} expected {expected:.3f} GB, got {got:.3f} GB": "{part} 应为 {expected:.3f} GB，得到 {got:.3f} GB",
    "{fn} agrees with estimate_memory, part by part, on all {count} layouts":
        "{fn} 在全部 {count} 种布局上都与 estimate_memory 逐项一致",
    "that is ZeRO sharding over all the ranks: it shards only over the dp axis":
        "那是 ZeRO 在所有 rank 上分片：它只在 dp 轴上分片",
    "that is the whole model on every rank: tp × pp ranks each hold 1/(tp·pp) of it":
        "那是每个 rank 都持有整个模型：tp × pp 个 rank 各持有它的 1/(tp·pp)",
    "that divides the model by every rank: the dp ranks are replicas, only tp × pp split it":
        "那是把模型除以所有 rank：dp 的各个 rank 是副本，只有 tp × pp 切分模型",
    "that counts Adam as 8 bytes: with bf16 weights it keeps an fp32 master copy too, 12 in all":
        "那是把 Adam 算成 8 个字节：权重为 bf16 时它还保存一份 fp32 主副本，共 12 个字节",
    "that counts gradients as fp32: here they are bf16, 2 bytes each":
        "那是把梯度算成 fp32：这里梯度是 bf16，每个 2 字节",
    "that ignores zero_stage: ZeRO-1 shards the optimizer state, 2 the gradients, 3 the weights":
        "那忽略了 zero_stage：ZeRO-1 对优化器状态分片，ZeRO-2 加上梯度，ZeRO-3 加上权重",
    "that shards the weights at ZeRO-2 instead of the gradients: ZeRO-2 shards the gradients (and the optimizer "
    "state); the weights stay whole until ZeRO-3":
        "那是在 ZeRO-2 对权重而不是梯度分片：ZeRO-2 对梯度（和优化器状态）分片；权重直到 ZeRO-3 才分片",
    "that shards one stage too early: ZeRO-1 shards only the optimizer state, ZeRO-2 adds the gradients, ZeRO-3 the "
    "weights":
        "那是早了一个阶段分片：ZeRO-1 只对优化器状态分片，ZeRO-2 加上梯度，ZeRO-3 加上权重",
    "that shards everything from ZeRO-1 on: stage 1 shards only the optimizer state":
        "那是从 ZeRO-1 起就对一切分片：阶段 1 只对优化器状态分片",
    "check_layout_choice({fn}, seed={seed}) draws these {count} scenarios again":
        "check_layout_choice({fn}, seed={seed}) 会再次抽出这 {count} 个场景",
    "{fn} for scenario {index} of {count} ({description}; {again})":
        "{fn} 在 {count} 个场景中的第 {index} 个（{description}；{again}）",
    "{where}: price takes a parlab.decide.planner.Layout, got {layout!r:.80}":
        "{where}：price 接受的是 parlab.decide.planner.Layout，得到 {layout!r:.80}",
    "{where}: priced {count} layouts ({layouts}); the budget is {budget}. Rule out first: what fits in "
    "{memory:.0f} GB, which axes may cross the links between GPUs and between nodes; then price the few that are "
    "left.":
        "{where}：为 {count} 种布局估了价（{layouts}）；预算是 {budget}。先排除：什么能放进 {memory:.0f} GB，"
        "哪些轴可以跨越 GPU 之间和节点之间的链路；再为剩下的几种估价。",
    "the exercise asks you to choose by the guide's rules and memory arithmetic, pricing at most {budget} layouts "
    "with the price argument, without the planner's predict or candidates":
        "本练习要你按指南的规则和显存算术来选，用 price 参数最多为 {budget} 种布局估价，不用规划器的 predict 或 "
        "candidates",
    "{fn} picks a fitting layout within {tolerance:.0%} of the fastest in {count} scenarios drawn afresh "
    "(seed={seed}), pricing at most {budget} layouts in each":
        "{fn} 在新抽取的 {count} 个场景（seed={seed}）中都选出了放得下、与最快者相差不超过 {tolerance:.0%} 的布局，"
        "每个场景最多估价 {budget} 种布局",
    "{where}: expected a parlab.decide.planner.Layout, got {got!r:.80}":
        "{where}：应返回 parlab.decide.planner.Layout，得到 {got!r:.80}",
    "{where}: {got} uses {used} GPUs; the cluster has {world_size}": "{where}：{got} 用了 {used} 个 GPU；集群有 {world_size} 个",
    "{where}: TP {tp} spans nodes of {per_node} GPUs": "{where}：TP {tp} 跨越了节点（每个节点只有 {per_node} 个 GPU）",
    "{where}: {got} is not a layout of this batch: {error}": "{where}：{got} 不是这个批次的布局：{error}",
    "{where}: {got} needs {needs:.1f} GB per GPU; it has {has:.0f} GB":
        "{where}：{got} 每个 GPU 需要 {needs:.1f} GB；GPU 只有 {has:.0f} GB",
    "{where}: {got} fits but takes {mine:.2f} s per step (predicted); a layout that fits takes {best:.2f} s. Where "
    "does yours lose time? ":
        "{where}：{got} 放得下，但每步需要 {mine:.2f} s（预测）；有一种放得下的布局只需 {best:.2f} s。你的布局在哪里浪费了时间？",

    # -- chapter 08: FSDP2 and a sharded checkpoint -----------------------------------------------------------
    "this exercise asks you to write the FSDP2 and checkpoint code yourself; parlab.lab.job.train_fsdp's functions "
    "are refused while your function runs":
        "本练习要你自己写 FSDP2 和检查点的代码；你的函数运行期间，parlab.lab.job.train_fsdp 的函数会被拒绝",
    "sharded_loop is not written yet (it raises NotImplementedError)": "sharded_loop 还没写（它抛出 NotImplementedError）",
    "on {world_size} ranks, every rank trained on the whole batch of {batch} rows each step ({counts} rows over "
    "{steps} steps): the shard step is missing. Each rank must train on its own rows, shard(x, dist.get_rank(), "
    "dist.get_world_size()); the losses and weights cannot show it (FSDP averages {world_size} equal gradients), "
    "but the job does the same work {world_size} times":
        "在 {world_size} 个 rank 上，每个 rank 每步都用整批 {batch} 行训练（{steps} 步共 {counts} 行）：少了分片这一步。"
        "每个 rank 必须只用自己的行训练，shard(x, dist.get_rank(), dist.get_world_size())；损失和权重看不出来"
        "（FSDP 对 {world_size} 个相等的梯度求平均），但作业把同样的工作做了 {world_size} 遍",
    "on {world_size} ranks, asked for steps {first_step}–{last}, your function trained steps 0–{last}: load the "
    "model and optimizer from load_from and go on from first_step, rather than replay the first steps":
        "在 {world_size} 个 rank 上，要求训练第 {first_step}–{last} 步，你的函数训练了第 0–{last} 步："
        "从 load_from 加载模型和优化器，再从 first_step 接着训练，而不是重放前几步",
    "on {world_size} ranks, steps {first_step}–{last} trained on the batches of steps 0–{replayed}: draw each "
    "step's batch with seed=step, for step from first_step":
        "在 {world_size} 个 rank 上，第 {first_step}–{last} 步用的是第 0–{replayed} 步的批次："
        "每一步的批次用 seed=step 抽取，step 从 first_step 开始",
    "on {world_size} ranks, steps {first_step}–{last}: the ranks' rows together are not each step's batch once "
    "(rows per rank: {counts}; expected {each} per step each). Rank r takes shard(x, r, {world_size}) of "
    "token_batch({batch}, {seq_len}, seed=step)":
        "在 {world_size} 个 rank 上，第 {first_step}–{last} 步：各 rank 的行合起来不是每步的批次恰好一次"
        "（每个 rank 的行数：{counts}；应为每个 rank 每步 {each} 行）。rank r 取 token_batch({batch}, {seq_len}, "
        "seed=step) 的 shard(x, r, {world_size})",
    "your function raised on rank {rank} of {world_size}: {type_name}: {message}":
        "你的函数在 rank {rank}（共 {world_size} 个）上抛出了 {type_name}：{message}",
    "on {world_size} ranks, no forward ran through a module fully_shard had made: the model is replicated, not "
    "sharded (call fully_shard on each of model.model.layers, then on the model, before training)":
        "在 {world_size} 个 rank 上，没有一次前向经过 fully_shard 生成的模块：模型是被复制，而不是被分片"
        "（训练前先对 model.model.layers 的每一层调用 fully_shard，再对模型调用）",
    "on {world_size} ranks, {missing} of the model's {blocks} decoder layers ran without being FSDP units of their "
    "own: fully_shard was called on the model's root only (or on some layers), so each forward gathers the whole "
    "model at once and sharding saves no peak memory (chapter 04). Call fully_shard on each of model.model.layers "
    "first, then on the model":
        "在 {world_size} 个 rank 上，模型的 {blocks} 个解码器层中有 {missing} 个运行时不是独立的 FSDP 单元："
        "fully_shard 只对模型的根（或部分层）调用了，所以每次前向都一次性收集整个模型，分片省不下峰值显存"
        "（第 04 章）。先对 model.model.layers 的每一层调用 fully_shard，再对模型调用",
    "on {world_size} ranks: expected a list of {steps} losses from every rank, got {got!r:.120}":
        "在 {world_size} 个 rank 上：每个 rank 应返回 {steps} 个损失组成的列表，得到 {got!r:.120}",
    "it is {world_size} times the loop's: each rank's loss was summed over ranks (an all_reduce with SUM). Return "
    "each rank's own loss: the check averages them":
        "它是循环的 {world_size} 倍：每个 rank 的损失在各 rank 上求了和（SUM 的 all_reduce）。"
        "返回每个 rank 自己的损失：检查会求平均",
    "{what}: loss {i} (the ranks' mean) is {got:.7f}, the single-process loop's is {want:.7f}; {hint}":
        "{what}：第 {i} 个损失（各 rank 的平均）是 {got:.7f}，单进程循环的是 {want:.7f}；{hint}",
    "fn must be the function you wrote; got {type}": "fn 必须是你写的函数；得到的是 {type}",
    "resume_world_size must differ from world_size (both {world_size}): the point is resharding":
        "resume_world_size 必须与 world_size 不同（两者都是 {world_size}）：要点就在于重新分片",
    "{name} must be an int ≥ 2 dividing the batch of {batch}; got {n!r}":
        "{name} 必须是 ≥ 2 且能整除批大小 {batch} 的 int；得到 {n!r}",
    "on {world_size} ranks, steps 0–{last}": "在 {world_size} 个 rank 上，第 0–{last} 步",
    "the first step already differs: start from tiny_llama(heads=4, kv_heads=4, seed=0), as the loop does":
        "第一步就不同：像循环那样，从 tiny_llama(heads=4, kv_heads=4, seed=0) 开始",
    "the first step matches, a later one does not, so the update differs: build the optimizer after fully_shard "
    "(before it, it holds the parameters fully_shard replaced), with the loop's lr and momentum":
        "第一步一致，后面某一步不一致，所以是更新不同：在 fully_shard 之后再创建优化器"
        "（在它之前创建，优化器持有的是被 fully_shard 替换掉的参数），并使用循环的 lr 和 momentum",
    "the checkpoint at save_to should hold one .distcp file per rank ({world_size}) and a .metadata file "
    "(torch.distributed.checkpoint.save on every rank); found {files}":
        "save_to 处的检查点应当每个 rank 有一个 .distcp 文件（{world_size} 个），外加一个 .metadata 文件"
        "（每个 rank 上都调用 torch.distributed.checkpoint.save）；实际找到 {files}",
    "the checkpoint holds no optimizer state (no momentum buffers): save the optimizer's state dict too "
    "(get_state_dict(model, opt)), or the resumed run restarts its momentum from zero":
        "检查点里没有优化器状态（没有 momentum buffer）：把优化器的 state dict 也保存下来"
        "（get_state_dict(model, opt)），否则恢复后的运行会从零重新开始累积动量",
    "resumed on {resume_world_size} ranks from your checkpoint, which the check altered (weights × {weights}, "
    "momentum × {momentum}), steps {half}–{last}":
        "在 {resume_world_size} 个 rank 上从你的检查点恢复（检查改动过它：权重 × {weights}，动量 × {momentum}），"
        "第 {half}–{last} 步",
    "the first resumed step is not the checkpoint's weights: does load_from load the model's state (dcp.load, then "
    "set_state_dict), rather than replay the first steps?":
        "恢复后的第一步用的不是检查点的权重：load_from 是否加载了模型的状态（dcp.load，再 set_state_dict），"
        "而不是重放前几步？",
    "the first resumed step matches, so the weights were loaded, but a later one does not: load the optimizer's "
    "state too (set_state_dict's optim_state_dict), or its momentum restarts":
        "恢复后的第一步一致，说明权重已加载，但后面某一步不一致：把优化器的状态也加载进来"
        "（set_state_dict 的 optim_state_dict），否则它的动量会从头开始",
    "{steps} losses equal the single-process loop's: {half} steps on {world_size} ranks, saved as {world_size} "
    "shards, resumed from them on {resume_world_size} ranks, each rank on its shard of every batch":
        "{steps} 个损失与单进程循环的相同：在 {world_size} 个 rank 上训练 {half} 步，保存为 {world_size} 个分片，"
        "再从这些分片在 {resume_world_size} 个 rank 上恢复，每个 rank 都只用每个批次中属于自己的分片",

}
