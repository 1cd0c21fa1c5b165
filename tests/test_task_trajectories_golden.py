"""The Task base class owns the rollout; porting the tasks to it changed no trajectory.

Seeded rollouts of each task (MemAgent QA, MemoryUpdate LoCoMo, examples/mem1) on the tiny
model (HF engine, CPU), on the scripted engine and on the warm start's oracles: their
canonical JSON (turns' token ids, log-probs, texts, finish reasons; rewards, answers, scores)
hashes to what the rollouts gave before the base class (commit 9071c3a, each task's own
`rollout`). The `reward/<name>` parts are left out of the hash: MemoryUpdate's reward became
a named part, so it now logs `reward/memory_delta` too; each reward is checked against them.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from helpers import ScriptedAsyncEngine, locomo_episode, tool_reply

from memrl.agents.memagent import MemAgentConfig
from memrl.agents.memupdate import MemUpdateConfig
from memrl.agents.oracle import OracleGenerator
from memrl.data.synthetic import make_synthetic_records
from memrl.inference.hf import HFEngine
from memrl.inference.loader import load_pretrained
from memrl.memory.embedder import HashingEmbedder
from memrl.tasks import RolloutSpec
from memrl.tasks.memagent_qa import MemAgentQATask
from memrl.tasks.memupdate_locomo import MemoryUpdateTask

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from mem1.task import Mem1Config, Mem1Task  # noqa: E402

GOLDEN = {  # name: (sha256 of the canonical JSON, trajectories, turns, rewards)
    "memagent_hf": ("25ea4e23c504fccae6d794ca8c43e24c25d341fe8a89f578d072c1a3a7ca4298",
                    6, 24, [0.0] * 6),
    "mem1_hf": ("3be90c3d1010ca2950b06995d72b09683cf3522c1425fecd54af25ba65651634",
                6, 18, [0.0] * 6),
    "memupdate_hf": ("ab5bbe745dd423b7e6a4a2ff4be7585167d6d817a219fb04dc8c0ae6bda3226e",
                     4, 10, [0.0] * 4),
    "memupdate_scripted": ("473dc1f8bcad7962a04dd5e85206d7999f0d29c6cdeb7641e0f9f6eb5746cd00",
                           4, 24, [-0.2, -0.06666666666666667, -0.1, -0.13333333333333333]),
    "mem1_oracle": ("8e0c912b366532c4d9e97fda971b1a94c7393042339d666dafa7e0498b6ff5cc",
                    6, 14, [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]),
    "memagent_oracle": ("5f6bb43e088d6948ab69f5172d3f9f6e117cca7e03fb6910862937cdec1845a4",
                        6, 24, [1.5] * 6),
}
SPEC = RolloutSpec(num_samples=2, seed=7, temperature=1.0, top_p=0.9)


def canonical(trajectories) -> str:
    return json.dumps([{
        "record_id": t.record_id, "sample_index": t.sample_index, "reward": t.reward,
        "answer": t.answer,
        "metrics": {k: t.metrics[k] for k in sorted(t.metrics) if not k.startswith("reward/")},
        "turns": [{"kind": u.kind, "prompt_ids": list(u.prompt_ids),
                   "response_ids": list(u.response_ids),
                   "response_logprobs": [float(x) for x in u.response_logprobs],
                   "response_text": u.response_text, "finish_reason": u.finish_reason}
                  for u in t.turns]} for t in trajectories], sort_keys=True)


@pytest.fixture(scope="module")
def cases(tiny_model_dir):
    model, tok = load_pretrained(tiny_model_dir, device="cpu")
    engine = HFEngine(model, tok, generation_batch_size=8)
    qa = make_synthetic_records(3, num_docs=2, seed=3)
    memagent = MemAgentConfig(chunk_size=48, max_memory_tokens=12, max_final_tokens=8)
    longer = memagent.model_copy(update={"max_memory_tokens": 64, "max_final_tokens": 16})
    tools = MemUpdateConfig(embedder="hashing", max_turns=3, session_chunk_turns=2,
                            max_response_tokens=24, memory_view_k=3)
    mem1_weights = {"em": 1.0, "early_stop": 0.1}
    mem1 = Mem1Task(Mem1Config(max_turn_tokens=64), mem1_weights)
    return {
        "memagent_hf": (MemAgentQATask(memagent, reward={"f1": 1.0, "em": 0.5}), engine, qa),
        "mem1_hf": (Mem1Task(Mem1Config(max_turn_tokens=10), mem1_weights), engine, qa),
        "memupdate_hf": (MemoryUpdateTask(tools, embedder=HashingEmbedder()), engine,
                         [locomo_episode("e0", 3), locomo_episode("e1", 5)]),
        "memupdate_scripted": (
            MemoryUpdateTask(tools, embedder=HashingEmbedder(), reward={"memory_delta": 2.0}),
            ScriptedAsyncEngine(tok, tool_reply, seed=5),
            [locomo_episode("e0", 3), locomo_episode("e1", 7)]),
        "mem1_oracle": (mem1, mem1.oracle(tok, qa), qa),
        "memagent_oracle": (MemAgentQATask(longer, reward={"sub_em": 1.0, "f1": 0.5}),
                            OracleGenerator(tok, qa, longer), qa),
    }


@pytest.mark.parametrize("name", list(GOLDEN))
def test_trajectories_are_those_before_the_base_class(cases, name):
    task, engine, records = cases[name]
    trajectories = task.rollout(engine, records, SPEC)
    digest, n, turns, rewards = GOLDEN[name]
    assert (len(trajectories), sum(len(t.turns) for t in trajectories)) == (n, turns)
    assert [t.reward for t in trajectories] == rewards
    assert hashlib.sha256(canonical(trajectories).encode()).hexdigest() == digest
    for t in trajectories:  # the reward is the weighted sum of its named parts
        parts = sum(w * t.metrics[f"reward/{k}"] for k, w in task.weights.items())
        assert t.reward == pytest.approx(parts)


def test_keywords_stand_for_the_spec(cases):
    task, engine, records = cases["mem1_oracle"]
    assert canonical(task.rollout(engine, records, num_samples=2, seed=7, temperature=1.0,
                                  top_p=0.9)) == canonical(task.rollout(engine, records, SPEC))
    with pytest.raises(TypeError, match="not both"):
        task.rollout(engine, records, SPEC, seed=3)
