"""tensorflow-datasets builder for a user's local MetaMathQA / GSM8K-style JSONL (manual directory).

Nothing is downloaded: put the files in the manual directory and build, e.g.

    builder = MathJsonl(data_dir=d)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=m))
    env, params = environments.make("arithmetic", tokenizer, problems=load_problems(d, name="math_jsonl"))

(`load_problems` is in `environments.datasets.generated`.)

Files: `*.jsonl` (one JSON object per line, blank lines ignored); names starting with "test" go to the
`test` split, all others to `train`. Each record is either MetaMathQA-style `{"query", "response"}`
where the response ends with "The answer is: X" (RAGEN's MetamathQA env takes the gold answer as the
text after "The answer is: "), or GSM8K-style `{"question", "answer"}` where the answer ends with
"#### X". Stored per example: `question`, `solution` (the reasoning before the final-answer marker;
GSM8K's `<<48/2=24>>` calculator notes removed) and `answer` (X, stripped). A record with neither
format, or without the final-answer marker, is an error naming the file and line.
"""
from __future__ import annotations

import json
import re

import tensorflow_datasets as tfds

_METAMATH = re.compile(r"The answer is:?\s*(.*?)\s*$", re.DOTALL)
_GSM8K = re.compile(r"####\s*(.*?)\s*$", re.DOTALL)
_CALCULATOR = re.compile(r"<<[^>]*>>")


def parse_record(record: dict, where: str) -> dict[str, str]:
    """question / solution / answer of one JSONL record (`where` names it in errors)."""
    if "query" in record and "response" in record:
        question, text, pattern = record["query"], record["response"], _METAMATH
    elif "question" in record and "answer" in record:
        question, text, pattern = record["question"], _CALCULATOR.sub("", record["answer"]), _GSM8K
    else:
        raise ValueError(f"{where}: expected keys query/response or question/answer, got {sorted(record)}")
    match = pattern.search(text)  # the answer runs from the first marker to the end, as in RAGEN
    if match is None or not match.group(1):
        marker = "The answer is:" if pattern is _METAMATH else "####"
        raise ValueError(f"{where}: no final answer after {marker!r} in {text[-80:]!r}")
    return {"question": question.strip(), "solution": text[: match.start()].strip(), "answer": match.group(1)}


class MathJsonl(tfds.core.GeneratorBasedBuilder):
    """Math word problems with one final answer, from local MetaMathQA / GSM8K JSONL files."""

    VERSION = tfds.core.Version("1.0.0")
    # one config per data set kept side by side, e.g. MathJsonl(config=tfds.core.BuilderConfig(name="gsm8k"))
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="default", description="the files of the manual directory")]
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Place MetaMathQA-style (query/response) or GSM8K-style (question/answer) *.jsonl files in the "
        "manual directory; files whose names start with 'test' form the test split, the others train."
    )

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.__doc__,
            features=tfds.features.FeaturesDict({
                "question": tfds.features.Text(),
                "solution": tfds.features.Text(),
                "answer": tfds.features.Text(),
            }),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        files = sorted(dl_manager.manual_dir.glob("*.jsonl"))
        if not files:
            raise FileNotFoundError(f"no *.jsonl files in the manual directory {dl_manager.manual_dir}")
        splits = {"train": [f for f in files if not f.name.startswith("test")],
                  "test": [f for f in files if f.name.startswith("test")]}
        return {split: self._generate_examples(paths) for split, paths in splits.items() if paths}

    def _generate_examples(self, paths):
        for path in paths:
            with path.open() as f:
                for line_no, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    where = f"{path}:{line_no}"
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise ValueError(f"{where}: not JSON ({err})") from None
                    yield f"{path.name}:{line_no:09d}", parse_record(record, where)
