import gc  # run: torchrun --standalone --nproc_per_node 2 examples/torchrec_quickstart.py

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.planner import Topology
from torchrec.distributed.sharding_plan import get_default_sharders

from autoshard.torchrec.autoshard_planner import AutoshardPlanner

dist.init_process_group("gloo")  # torchrun gives each process its rank and a free port
tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=16 * (i + 1), feature_names=[f"f{i}"],
                             num_embeddings=1000 * (i + 1)) for i in range(4)]
model = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))  # no weights yet
planner = AutoshardPlanner(Topology(world_size=2, compute_device="cpu"))
plan = planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)
sharded = DistributedModelParallel(model, plan=plan, device=torch.device("cpu"))
torch.manual_seed(0)  # the same unsharded model and batch on every rank
unsharded = EmbeddingBagCollection(tables=tables)
sharded.load_state_dict(unsharded.state_dict())  # the sharded model takes its weights
batch = KeyedJaggedTensor.from_lengths_sync(  # 8 samples, 3 ids a feature
    [f"f{i}" for i in range(4)], torch.randint(0, 1000, (96,)), torch.full((32,), 3))
got, want = sharded(batch).to_dict(), unsharded(batch).to_dict()
same = torch.tensor(float(all(torch.allclose(got[k], want[k]) for k in want)))
dist.all_reduce(same, op=dist.ReduceOp.MIN)  # 1 when every rank's outputs are equal
assert same.item() == 1.0, "the sharded pooled embeddings differ from the unsharded model's"
print(f"quick start OK (rank {dist.get_rank()}): sharded pooled embeddings equal unsharded ones")
del sharded  # freed while its process groups live: gloo may abort at exit otherwise
gc.collect()
