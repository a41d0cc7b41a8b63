"""`RNGStreams`: one random stream per purpose, so that what one purpose draws never shifts another's draws.

A training run draws random numbers for several independent purposes:

| purpose | what draws from it |
|---|---|
| `"rollout"` | the agents' sampling of training rollouts (and of an iterative round's own candidates) |
| `"comparator"` | a comparator that samples the live agents (`current`, `current_copy`) |
| `"reward_model_init"` | the newly initialised head of each joint reward model (MARLHF, every MARLHFIter round) |
| `"replay"` | the replay mode's choice of stored pairs (iterative trainers) |
| `"critic_init"` | the newly initialised value heads of critics and of actors (actor-critic trainers; drawn once, at construction, on every process from the rank-0 stream, before the Trainer seeds anything) |

Each (purpose, round) stream is seeded from `args.seed`, the purpose, the round and the process index (a hash, so
streams never share a seed), and lives on the devices that sample: a CPU state and one state per CUDA device of the
agents. Nothing here reseeds the global RNG.

Hugging Face `generate` samples from the GLOBAL torch RNG (it takes no generator), so sampling runs inside
`streams.scoped(purpose, round)`: a `torch.random.fork_rng`-style swap that loads the stream's CPU and CUDA states
into the global generators, runs the block, stores the advanced states back in the stream and restores the global
states the block found. Code that takes a generator can use `streams.generator(purpose, round)` (CPU) instead, and
numpy consumers `streams.numpy(purpose, round)`.

`state_dict()` / `load_state_dict()` hold every stream's state (tensors, for `torch.save`), so a resumed run draws
exactly what an uninterrupted one would. Trainers hold their streams as `trainer.rng_streams`.

Choices that must not depend on which process makes them, nor on what was drawn before (which pairs a task item keeps
under `pair_selection="random"`), draw from `keyed_rng(seed, purpose, *key)` instead: a fresh generator per key
(e.g. per round and item), so there is no state to checkpoint and 1 or N processes choose alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Iterator, Sequence

import numpy as np
import torch

__all__ = ["RNGStreams", "PURPOSES", "stream_seed", "keyed_rng"]

PURPOSES = ("rollout", "comparator", "reward_model_init", "replay", "critic_init")


def stream_seed(seed: int, purpose: str, round: int = 0, rank: int = 0) -> int:
    """A 63-bit seed for one stream: a hash of (seed, purpose, round, rank), so distinct streams never collide."""
    digest = hashlib.sha256(f"trl_marl/{int(seed)}/{purpose}/{int(round)}/{int(rank)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def keyed_rng(seed: int, purpose: str, *key: int) -> random.Random:
    """A fresh `random.Random` whose draws depend only on (seed, purpose, key): not on the process that draws, nor on
    anything drawn before. For choices keyed by a piece of data (a round and a task item) that every process count
    must make alike."""
    text = "/".join(str(int(k)) for k in key)
    digest = hashlib.sha256(f"trl_marl/keyed/{int(seed)}/{purpose}/{text}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


class RNGStreams:
    """Named random streams (see the module docstring).

    Args:
        seed: the run's seed (`args.seed`).
        rank: the process index (each process samples its own share, from its own streams).
        devices: the CUDA devices that sample (the agents' devices); CPU-only runs pass none.
    """

    def __init__(self, seed: int, rank: int = 0, devices: Sequence[torch.device | str | int] = ()):
        self.seed, self.rank = int(seed), int(rank)
        cuda = []
        for d in devices:
            d = torch.device(d) if not isinstance(d, int) else torch.device("cuda", d)
            if d.type == "cuda":
                idx = d.index if d.index is not None else torch.cuda.current_device()
                if idx not in cuda:
                    cuda.append(idx)
        self.cuda_devices = sorted(cuda)
        self._states: dict[str, dict[str, torch.Tensor]] = {}

    @staticmethod
    def key(purpose: str, round: int = 0) -> str:
        return f"{purpose}/{int(round)}"

    def seed_for(self, purpose: str, round: int = 0) -> int:
        """The seed of stream (purpose, round) on this process."""
        return stream_seed(self.seed, purpose, round, self.rank)

    def _state(self, purpose: str, round: int) -> dict[str, torch.Tensor]:
        key = self.key(purpose, round)
        if key not in self._states:
            s = self.seed_for(purpose, round)
            state = {"cpu": torch.Generator().manual_seed(s).get_state()}
            for idx in self.cuda_devices:
                state[f"cuda:{idx}"] = torch.Generator(device=f"cuda:{idx}").manual_seed(s).get_state()
            self._states[key] = state
        return self._states[key]

    @contextlib.contextmanager
    def scoped(self, purpose: str, round: int = 0) -> Iterator[None]:
        """Run the block with the global torch RNG (CPU and the sampling CUDA devices) set to this stream's state;
        afterwards the stream keeps its advanced state and the global RNG is as the block found it."""
        state = self._state(purpose, round)
        with torch.random.fork_rng(devices=self.cuda_devices, device_type="cuda"):
            torch.set_rng_state(state["cpu"])
            for idx in self.cuda_devices:
                torch.cuda.set_rng_state(state[f"cuda:{idx}"], idx)
            yield
            state["cpu"] = torch.get_rng_state()
            for idx in self.cuda_devices:
                state[f"cuda:{idx}"] = torch.cuda.get_rng_state(idx)

    def generator(self, purpose: str, round: int = 0) -> torch.Generator:
        """A CPU `torch.Generator` at this stream's state (for APIs that take one). Draws from it do NOT advance the
        stream; use `scoped` for draws that must."""
        g = torch.Generator()
        g.set_state(self._state(purpose, round)["cpu"])
        return g

    def numpy(self, purpose: str, round: int = 0) -> np.random.Generator:
        """A numpy Generator seeded from the stream's seed (replay modes take one); fresh on every call."""
        return np.random.default_rng(self.seed_for(purpose, round))

    # ---- checkpoints ----
    def state_dict(self) -> dict:
        """Every stream's state: `{"seed", "rank", "streams": {"purpose/round": {"cpu": ByteTensor, "cuda:i": ...}}}`
        (tensors and plain values only: `torch.save(..., weights_only=True)`-loadable)."""
        return {
            "seed": self.seed,
            "rank": self.rank,
            "streams": {k: {d: t.clone() for d, t in v.items()} for k, v in self._states.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()`'s streams (streams created later start from their seeds, as in the original run)."""
        if int(state.get("seed", self.seed)) != self.seed:
            raise ValueError(
                f"these random streams were saved by a run with seed={state['seed']}, this run has seed={self.seed}"
            )
        streams = {}
        for key, devs in state["streams"].items():
            streams[key] = {d: torch.as_tensor(t, dtype=torch.uint8).clone() for d, t in devs.items()}
            missing = [f"cuda:{i}" for i in self.cuda_devices if f"cuda:{i}" not in streams[key]]
            if missing:  # saved on CPU, resumed on CUDA: the CUDA part starts from its seed
                purpose, round = key.rsplit("/", 1)
                for d in missing:
                    g = torch.Generator(device=d).manual_seed(self.seed_for(purpose, int(round)))
                    streams[key][d] = g.get_state()
        self._states = streams
