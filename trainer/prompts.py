"""The actor's chat: system prompt, observation turns, and the token ids the engine sees
(docs/design.md §3.1).

Token in, token out: the ids the engine generated are kept as they are and never re-tokenised, so the
trainer scores exactly what was sampled. ``ChatBuilder`` only tokenises what the *environment* adds:
the opening prompt (system + first observation) and, after each action, the observation turn that the
model's chat template puts between the action and the next generation. Those ids are masked out of the
loss; the actor's own generated ids are the only trained tokens.

When a context no longer fits its token budget, ``ChatBuilder.rebuild`` renders a fresh prompt from the
system prompt and as many of the latest turns as fit in half the budget (older turns are dropped with a
note that says so); the caller starts a new training segment there (see ``trainer.rollout.runner``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainer.envs.base import TextEnv

_PLACEHOLDER = "\x00ACTION\x00"
OMITTED_NOTE = "(Earlier turns were dropped to fit the context. Goal: {goal})"


PLACEMENTS = ("system", "turn")
"""Where a guided episode's experience goes: the system prompt, or every observation turn."""


def experience_block(experience: str) -> str:
    return f"Experience from earlier episodes that may help:\n{experience.strip()}"


def system_prompt(env: TextEnv, experience: str | None = None) -> str:
    """The env's instructions and action syntax, plus the injected experience for guided rollouts."""
    parts = [env.instructions.strip(), env.action_syntax.strip()]
    if experience:
        parts.append(experience_block(experience))
    return "\n\n".join(parts)


ANSWER_PREFIXES = {"MiniHack-": "Direction:"}
"""Assistant-turn openers by env name prefix. Measured with SmolLM2-135M on MiniHack-Room-5x5 at
temperature 0.7: 75% of answers hold a valid direction after "Direction:", 12% after "Action:", 6% with
no opener. An env may set its own with a class attribute ``answer_prefix``."""


def answer_prefix(env: TextEnv) -> str:
    """Text written at the start of every assistant turn, before the actor's own tokens (masked out)."""
    own = getattr(env, "answer_prefix", None)
    if own is not None:
        return own
    return next((p for name, p in ANSWER_PREFIXES.items() if env.name.startswith(name)), "Action:")


def user_message(observation: str, env: TextEnv, experience: str | None = None) -> str:
    """An observation as the actor reads it: the env's text, then a one-line reminder of the syntax, then
    (placement 'turn') the guided episode's experience, right before the answer."""
    text = f"{observation}\n\n{env.action_syntax.strip()}"
    return f"{text}\n\n{experience_block(experience)}" if experience else text


def _ids(encoded: Any) -> list[int]:
    # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True); 4.x a list
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


class ChatBuilder:
    """Token ids of an actor chat, built with the tokenizer's own chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id: int = tokenizer.eos_token_id
        eos_text = tokenizer.decode([self.eos_token_id])
        # What the template writes between an assistant message's text and the next user message's text,
        # and after that user text up to the next generation: e.g. for ChatML
        # "<|im_end|>\n<|im_start|>user\n" + obs + "<|im_end|>\n<|im_start|>assistant\n".
        marker = "\x00OBS\x00"
        full = self.render(
            [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "u"},
                {"role": "assistant", "content": _PLACEHOLDER},
                {"role": "user", "content": marker},
            ]
        )
        after_action = full[full.index(_PLACEHOLDER) + len(_PLACEHOLDER) :]
        before, after = after_action.split(marker)
        self._turn_prefix, self._turn_suffix = before, after
        # the generated EOS already closes the assistant turn when the template closes it with EOS text
        self._closes_with_eos = bool(eos_text) and before.startswith(eos_text)
        self._eos_text = eos_text

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        """The chat as text, ready for the assistant's next message."""
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt(self, system: str, observation: str, answer_prefix: str = "") -> list[int]:
        """The opening prompt: system message, the first observation, the generation prompt, the opener."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": observation}]
        return self.encode_text(self.render(messages) + answer_prefix)

    def observation_turn(
        self, observation: str, action_ids: Sequence[int], answer_prefix: str = ""
    ) -> list[int]:
        """Ids to append after the generated ``action_ids``: end of the assistant turn, the observation
        as a user turn, the generation prompt and the opener. The generated EOS is not repeated."""
        prefix = self._turn_prefix
        if self._closes_with_eos and action_ids and action_ids[-1] == self.eos_token_id:
            prefix = prefix[len(self._eos_text) :]
        return self.encode_text(prefix + observation + self._turn_suffix + answer_prefix)

    def rebuild(
        self,
        system: str,
        history: Sequence[tuple[str, str]],
        observation: str,
        budget: int,
        goal: str = "",
        answer_prefix: str = "",
    ) -> tuple[list[int], int]:
        """A fresh prompt of at most ``budget`` tokens: the system prompt, the latest turns that fit,
        then ``observation`` and the opener. ``history``: (observation, assistant text) pairs, oldest first.

        Returns (ids, turns kept). Raises ``ContextOverflow`` when even no history does not fit.
        """
        for keep in range(len(history), -1, -1):
            kept = history[len(history) - keep :]
            messages = [{"role": "system", "content": system}]
            for i, (obs, action) in enumerate(kept):
                note = OMITTED_NOTE.format(goal=goal) + "\n" if i == 0 and keep < len(history) else ""
                messages += [
                    {"role": "user", "content": note + obs},
                    {"role": "assistant", "content": action},
                ]
            note = OMITTED_NOTE.format(goal=goal) + "\n" if not kept and history else ""
            messages.append({"role": "user", "content": note + observation})
            ids = self.encode_text(self.render(messages) + answer_prefix)
            if len(ids) <= budget:
                return ids, keep
        raise ContextOverflow(
            f"the system prompt and the latest observation alone take {len(ids)} tokens, more than the "
            f"context budget of {budget}: raise rollout.context_tokens"
        )


class ContextOverflow(RuntimeError):
    """Even the shortest prompt (system + latest observation) exceeds the token budget."""
