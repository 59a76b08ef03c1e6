"""Guess the number: an external environment for roll-cpp, in Python.

The agent guesses a secret number between 1 and max_number; after each
wrong guess it is told whether the secret is higher or lower. Rewards: +1
for the right number (which ends the episode), 0 for a wrong one,
format_penalty for an answer that is not a number in range. The secret is
drawn from the reset seed, so an episode replays exactly.

Options (env_options after the framework's own): max_number (default 8),
max_steps (default 6), format_penalty (default -0.1), and hang_on_step
(default 0: never), which makes step N of every episode never answer, for
trying out timeouts.
"""

import random
import threading

import roll_env


def read_options(options):
    known = {"max_number": "8", "max_steps": "6", "format_penalty": "-0.1", "hang_on_step": "0"}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"guess_number: unknown option {unknown[0]} (known: {', '.join(sorted(known))})")
    merged = {**known, **options}
    return (int(merged["max_number"]), int(merged["max_steps"]), float(merged["format_penalty"]),
            int(merged["hang_on_step"]))


def describe(options):
    max_number, max_steps, _, _ = read_options(options)
    return roll_env.Description(
        instructions=(f"Guess the secret whole number between 1 and {max_number}. After a wrong guess you are "
                      f"told whether the secret is higher or lower. You have {max_steps} guesses. Answer "
                      f"with one number, e.g. <answer>3</answer>."),
        actions=[str(n) for n in range(1, max_number + 1)])


class GuessNumber(roll_env.Episode):
    def __init__(self, options):
        self.max_number, self.max_steps, self.format_penalty, self.hang_on_step = read_options(options)

    def reset(self, seed):
        self.secret = random.Random(seed).randint(1, self.max_number)
        self.steps = 0
        return f"Guess a number between 1 and {self.max_number}."

    def step(self, action):
        self.steps += 1
        if self.steps == self.hang_on_step:
            threading.Event().wait()  # never answers
        truncated = self.steps >= self.max_steps
        text = roll_env.answer(action)
        if not text.isdigit() or not 1 <= int(text) <= self.max_number:
            return roll_env.StepResult(f"'{text}' is not a number between 1 and {self.max_number}. Guess again.",
                                       reward=self.format_penalty, done=truncated, truncated=truncated,
                                       action_valid=False)
        guess = int(text)
        if guess == self.secret:
            return roll_env.StepResult(f"{guess} is right.", reward=1.0, done=True, success=True)
        hint = "higher" if self.secret > guess else "lower"
        return roll_env.StepResult(f"{guess} is wrong; the secret is {hint}. Guess again.", done=truncated,
                                   truncated=truncated)


if __name__ == "__main__":
    roll_env.serve(describe, GuessNumber)
