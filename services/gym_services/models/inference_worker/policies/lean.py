"""``lean-refine``: a Lean prover that fails its first attempt and fixes it after a correction prompt.

First attempt (the conversation is a task's original "Complete the following Lean 4 code" prompt): a
short proof plan and the theorem closed with ``sorry`` — which the verifier rejects. Correction (any
later turn: the conversation holds an earlier assistant answer, or its user message is not an original
task prompt, e.g. the refinement prompt that embeds the failed attempt): the theorem with a proof
carrying :data:`LEAN_STANDIN_PASS_MARKER`, which the test stand-in of the Lean sandbox accepts.
No Lean toolchain runs here; with a real sandbox the correction would not compile.
"""

from __future__ import annotations

import re
from functools import cached_property

from gym_services.models.inference_worker.policies.base import Conversation, Policy, input_texts, load_tasks

#: A proof containing this line passes the Lean sandbox stand-in (and contains no ``sorry``).
LEAN_STANDIN_PASS_MARKER = "-- gym-checkpoint: verified"

FIRST_PROMPT_START = "Complete the following Lean 4 code"
#: a theorem declaration starts a line (NeMo Gym's correction prompt also says "the following theorem in Lean4")
_STATEMENT = re.compile(r"^theorem\s+\S+.*?:=\s*by\b", re.DOTALL | re.MULTILINE)
_NAME = re.compile(r"theorem\s+(\S+)")


def theorem_statement(text: str) -> str | None:
    """The first ``theorem ... := by`` in ``text`` that starts a line."""
    match = _STATEMENT.search(text)
    return match.group(0) if match else None


class LeanRefine(Policy):
    name = "lean-refine"
    description = "Lean prover: first proof uses sorry, the proof after a correction prompt passes the stand-in"

    @cached_property
    def first_prompts(self) -> frozenset[str]:
        return frozenset(p for task in load_tasks("math_formal_lean") for p in input_texts(task, "user")[:1])

    def is_correction(self, conversation: Conversation) -> bool:
        if conversation.count("assistant"):
            return True
        prompt = conversation.last("user") or ""
        if prompt in self.first_prompts:
            return False
        if not prompt.lstrip().startswith(FIRST_PROMPT_START):
            return True
        return prompt.count("```lean") > 1 or "error" in prompt.lower()

    def respond(self, conversation: Conversation) -> str:
        statement = next((s for t in reversed(conversation.of("user")) if (s := theorem_statement(t))), None)
        if statement is None:
            return "I could not find a Lean theorem to prove in this request."
        found = _NAME.search(statement)
        assert found is not None  # a theorem statement starts with ``theorem NAME``
        name = found.group(1)
        if self.is_correction(conversation):
            return (
                f"The previous attempt of `{name}` did not verify, so here is a completed proof.\n\n"
                f"```lean4\n{statement}\n  {LEAN_STANDIN_PASS_MARKER}\n  norm_num at *\n```"
            )
        return (
            f"Proof plan for `{name}`:\n"
            "1. Collect the hypotheses and substitute the given equalities.\n"
            "2. Reduce the goal to a numeric identity.\n"
            "3. Close it with the standard automation.\n\n"
            f"```lean4\n{statement}\n  sorry\n```"
        )
