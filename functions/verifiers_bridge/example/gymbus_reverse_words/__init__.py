"""An example verifiers (v1) environment package: reverse the order of a phrase's words.

Most of the reward for the exact order, some for keeping every word. Importable with
``PYTHONPATH=functions/verifiers_bridge/example``; ``gymbus tasks verifiers gymbus_reverse_words``
writes its tasks as rows.
"""

import verifiers.v1 as vf

PHRASES = [
    "queues carry every step",
    "the broker keeps the state",
    "a reward is never a failure",
    "workers hold nothing between messages",
    "every rollout ends exactly once",
    "replicas share one durable consumer",
    "traces follow each rollout",
    "profiles count failures apart",
]


class PhraseData(vf.TaskData):
    words: str
    """The phrase whose words are reversed."""
    answer: str
    """The words in reverse order."""


class PhraseTask(vf.Task[PhraseData]):
    @vf.reward(weight=0.75)
    async def reversed_exactly(self, task: PhraseData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == task.answer)

    @vf.reward(weight=0.25)
    async def words_kept(self, task: PhraseData, trace: vf.Trace) -> float:
        return float(sorted(trace.last_reply.split()) == sorted(task.words.split()))


class PhraseConfig(vf.TasksetConfig):
    n: int = len(PHRASES)


class PhraseTaskset(vf.Taskset[PhraseTask, PhraseConfig]):
    def load(self):
        for words in PHRASES[: self.config.n]:
            data = PhraseData(
                prompt=f"Reverse the order of the words of this phrase, and answer with the words only: {words}",
                words=words,
                answer=" ".join(reversed(words.split())),
            )
            yield PhraseTask(data, self.config.task)


__all__ = ["PhraseTaskset"]
