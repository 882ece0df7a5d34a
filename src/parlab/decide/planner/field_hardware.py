"""Figures for the GPUs the published runs of :mod:`~parlab.decide.planner.field_data` ran on: peaks, memory and
links as NVIDIA states them (some through a secondary page, which each ``source`` names) and collectives as
measured; each a ``dict`` with ``what``, ``value``, ``unit`` and ``source``."""

from __future__ import annotations

from parlab.decide.planner.field_data import TT_URL

# -- hardware ------------------------------------------------------------------------------------------------

TT_PEAK = ("github.com/pytorch/torchtitan torchtitan/tools/utils.py get_peak_flops (commit b5bcd76), quoting NVIDIA: ")
KLOCKWOOD = ("glennklockwood.com/garden/processors/B200 (tables of NVIDIA's Blackwell architecture technical brief): ")
MLPERF_B200 = ("MLCommons inference_results_v6.0, closed/Nebius/systems/nebius_b200_n1.json (a DGX/HGX B200 node as "
               "its submitter describes it): ")

HARDWARE_FACTS = (
    # -- compute
    {"what": "B200 (HGX/DGX, 1000 W) dense BF16 tensor peak", "value": 2250, "unit": "TFLOP/s per GPU",
     "source": TT_PEAK + "'B300' or 'B200': 'data from https://nvdam.widen.net/s/wwnsxrhm2w/blackwell-datasheet-"
               "3384703' -> 2.25e15; also " + KLOCKWOOD + "'The HGX variant of B200 ... at 1,000 W: BF16 2250 | 4500'"},
    {"what": "GB200 (1200 W) dense BF16 tensor peak", "value": 2500, "unit": "TFLOP/s per GPU",
     "source": TT_PEAK + "'GB200': 'BF16 dense per GPU: 2,500 TFLOPS (half of 5,000 TFLOPS with sparsity) GB200 data "
               "from https://www.nvidia.com/en-us/data-center/dgx-gb200' -> 2.5e15; also " + KLOCKWOOD +
               "'the GB200 variant of B200 when configured to 1,200 W: BF16 2500 | 5000'"},
    {"what": "B200 (HGX/DGX, 1000 W) dense FP8 tensor peak", "value": 4500, "unit": "TFLOP/s per GPU",
     "source": KLOCKWOOD + "HGX B200 at 1,000 W: 'FP8 | 4500 | 9000' (dense | sparse); secondary: NVIDIA's own page "
               "was not in the stored corpora"},
    {"what": "GB200 (1200 W) dense FP8 tensor peak", "value": 5000, "unit": "TFLOP/s per GPU",
     "source": KLOCKWOOD + "GB200 at 1,200 W: 'FP8 | 5000 | 10000' (dense | sparse); secondary as above"},
    # -- memory
    {"what": "B200 HBM3e capacity (DGX/HGX B200)", "value": 180, "unit": "GB per GPU",
     "source": MLPERF_B200 + "'accelerator_model_name': 'NVIDIA B200-SXM-180GB', 'accelerator_memory_capacity': "
               "'180 GB'; DGX B200: 'Eight NVIDIA Blackwell GPUs with 1,440 GB total HBM3e memory and 64 TB/s HBM3e "
               "bandwidth' (brent-newsom-nvidia.github.io/AIPS-Boom/wiki/NVIDIA-DGX-B200, from nvidia.com/en-us/"
               "data-center/dgx-b200)"},
    {"what": "B200 HBM3e bandwidth (DGX B200: 64 TB/s over 8 GPUs)", "value": 8, "unit": "TB/s per GPU",
     "source": "DGX B200 '1,440 GB total HBM3e memory and 64 TB/s HBM3e bandwidth' (AIPS-Boom wiki, from "
               "nvidia.com/en-us/data-center/dgx-b200), divided by 8 GPUs"},
    {"what": "GB200 HBM3e capacity as a GB200 NVL72 node reports it", "value": 186, "unit": "GB per GPU",
     "source": "MLCommons inference_results_v6.1, closed/Crusoe/systems/GB200-NVL72_GB200-186GB_aarch64x16_Dynamo.json: "
               "'accelerator_memory_capacity': '186 GB', 'accelerator_model_name': 'NVIDIA GB200'"},
    # -- NVLink 5
    {"what": "NVLink 5 links per GPU (GB200)", "value": 18, "unit": "links",
     "source": "docs.nvidia.com/health-validation/reference/checks/nvlink, nvlink_bandwidth_count_speed: "
               "'expected_link_count 18 ... GB200 exposes 18 NVLink 5 links'"},
    {"what": "NVLink 5 per-link speed (GB200; H100's NVLink 4 for comparison: 26562)", "value": 53125,
     "unit": "MB/s per link",
     "source": "docs.nvidia.com/health-validation/reference/checks/nvlink: 'expected_speed_mbytes_per_sec GB200: "
               "53125, GB300: 53125, H100: 26562'"},
    {"what": "NVLink 5 bandwidth per GPU, both directions together (900 GB/s each way)", "value": 1800,
     "unit": "GB/s per GPU",
     "source": MLPERF_B200 + "'accelerator_interconnect': '18x 5th Gen NVLink, 14.4 TB/s aggregated bandwidth' for 8 "
               "GPUs; Azure/AI-benchmarking-guide issue #7: 'Each GPU has 900GB/s unidirectional bw to nvswitch'"},
    {"what": "NCCL's modelled NVLink bandwidth per link, Blackwell (SM100); Hopper (SM90) is 20.6", "value": 40.1,
     "unit": "GB/s per link per direction",
     "source": "NVIDIA/nccl src/graph/topo.h: '#define SM90_NVLINK_BW 20.6', '#define SM100_NVLINK_BW 40.1'; NVIDIA/"
               "nccl issue #1807 (B200, NCCL 2.27): 'in nccl log, the maxBw is 720' (18 x 40.1 = 721.8)"},
    {"what": "NVLink domain of a GB200 NVL72 rack", "value": 72, "unit": "GPUs (36 Grace CPUs, 130 TB/s NVLink "
                                                                         "Switch System)",
     "source": "datacrunch.io/blog/nvidia-gb200-nvl72-for-ai-training-and-inference: 'a customized datacenter rack "
               "containing 36 Grace CPUs and 72 Blackwell GPUs connected by a 130 TB/s NVLink Switch System' "
               "(130 TB/s / 72 = 1.8 TB/s per GPU); NVIDIA Mission Control docs (nvlinkinfo): NVLink 5 supports "
               "'up to 576 GPUs in a single NVLink domain'"},
    # -- measured collectives
    {"what": "measured all-reduce bus bandwidth, 72 GPUs of one GB200 NVL72 rack, 8 GiB", "value": 834.57,
     "unit": "GB/s busbw (out-of-place; 846.82 in-place; 4 GiB: 839.16)",
     "source": "coreweave/nccl-tests pull request #43 'Add a GB200 NVL72 example': '8589934592 2147483648 float sum -1 "
               "20299 423.16 834.57 0 20006 429.37 846.82 0' (all_reduce_perf, full rack)"},
    {"what": "measured all-reduce bus bandwidth, 8 B200 in one node", "value": 830,
     "unit": "GB/s busbw ('830+')",
     "source": "NVIDIA/nccl issue #1807: 'should the all_reduce_perf performance of 8 B200s in a single machine reach "
               "900+? Ours is 830+.' (NCCL 2.27.1)"},
    {"what": "measured GPU-to-GPU copy bandwidth on GB200 (nvbandwidth p2p)", "value": 770, "unit": "GB/s",
     "source": "Azure/AI-benchmarking-guide issue #7, comment 2025-04-16: 'btw, nvbandwidth's p2p is about 770GB/s'"},
    {"what": "H100 NVLink 4 as NCCL reaches it (line rate 450 GB/s each way; NVLS all-reduce peak busbw ~480)",
     "value": 370, "unit": "GB/s effective per GPU per direction",
     "source": "NVIDIA/nccl-tests issue #212, sjeaugey: '450GB/s is the line rate. With the protocol overhead (~20%) "
               "NCCL can get an effective NVLink bandwidth of 370GB/s ... On 8 GPUs, you should reach a peak busBw of "
               "~480GB/s'"},
    {"what": "measured all-reduce bus bandwidth, 8 H800 in one node", "value": 215, "unit": "GB/s busbw",
     "source": "NVIDIA/nccl issue #1374 (user report): 'I have also conducted a test on H800 * 8 node, and the reported "
               "allreduce budBW is 215 GB/s, which is bigger than unidirectional peak BW 200GB/s'"},
    # -- networks
    {"what": "DGX/HGX B200 scale-out network", "value": 400, "unit": "Gb/s per GPU (8 x ConnectX-7 NDR per node)",
     "source": MLPERF_B200 + "'host_networking': '8x ConnectX-7 IB NDR 400Gb/s + 200Gb/s Ethernet NIC'; NVIDIA/"
               "nccl-tests issue #389: '8xB200 compute nodes ... equipped with ConnectX-7 NDR 400 Gb/s InfiniBand'"},
    {"what": "GB200 NVL72 compute tray NICs (one deployment)", "value": 4,
     "unit": "ConnectX-7-class NICs per 4-GPU tray (BlueField-3)",
     "source": "MLCommons inference_results_v6.1, Crusoe GB200-NVL72 system JSON: 'host_network_card_count': 'for each "
               "4-GPU node: 4x Mellanox MT43244 BlueField-3 [ConnectX-7 Lx]'"},
    # -- H800 and the runs' own clusters
    {"what": "H800 NVLink bandwidth as DeepSeek's cluster reaches it", "value": 160, "unit": "GB/s per GPU",
     "source": "DeepSeek-V3 report, arXiv:2412.19437, §3.2.2: 'NVLink offers a bandwidth of 160 GB/s, roughly "
               "3.2 times that of IB (50 GB/s)'"},
    {"what": "H800 cluster InfiniBand bandwidth (DeepSeek-V3)", "value": 50, "unit": "GB/s per GPU",
     "source": "DeepSeek-V3 report, arXiv:2412.19437, §3.2.2 (as above)"},
    {"what": "Grand Teton H100 (torchtitan benchmarks) HBM", "value": 96, "unit": "GB HBM2e, 2.4 TB/s, 500 W",
     "source": f"{TT_URL}, Hardware: 'Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec peak memory "
               "bandwidth'; 'We used the default 500W power limit'"},
    {"what": "Grand Teton H100 (torchtitan benchmarks) network", "value": 400, "unit": "Gb/s RDMA per GPU",
     "source": f"{TT_URL}, Hardware: 'Hosts are inter-connected with backend RDMA network with 400 Gb/s per GPU.'"},
)
