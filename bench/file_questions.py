"""How well files first tells a question about the conversation's file from one about the
company's documents (worker/media/file_questions.py), measured, not assumed.

Two sets, each asked with a file ("policy.pdf") in the conversation:

- the development questions of the demo's evaluation (eval_sets/dev.jsonl + new_wordings.jsonl:
  every one asks the handbook, none the file): how many would be taken as referring to the file
  (false positives; such a question is still searched in the knowledge base, and its passages
  still shown, so the cost of one is small);
- ``FILE_QUESTIONS`` below, written as employees ask about a file they sent, in both languages and
  many wordings (recall of the rule "it refers to the file"; a miss is still answered from the
  file when the knowledge base finds nothing, or when a passage of the file is relevant).

    python -m bench.file_questions

prints the two rates and the questions each rule got wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

from worker.media.file_questions import refers_to_file

EVAL_SETS = Path(__file__).resolve().parent.parent / "inference" / "demo" / "eval_sets"
FILES = [{"name": "policy.pdf", "text": "Hotels in Beijing: up to 600 RMB per night.", "ref": 1}]
FILE_QUESTIONS = [
    "这个文件讲了什么？", "这份文件主要说了什么", "帮我总结一下", "总结下这个 PDF", "这篇文档的要点是什么？",
    "文件里北京住宿标准是多少？", "文档中提到出租车了吗", "我刚发的文件你看了吗", "上面的文件有几页",
    "附件里写的截止日期是哪天", "刚才那份材料说了什么", "这份报告的结论是什么", "该文件适用于哪些人",
    "你读的那个文件里有报销流程吗", "policy.pdf 说了什么", "policy 里面住宿多少钱",
    "概括一下这份资料", "这个表格里有几行", "合同里违约金是多少？", "这份合同什么时候到期",
    "What is this file about?", "Summarize the document", "summarise it please",
    "What does the attached file say about hotels?", "In the document, who approves trips?",
    "tl;dr", "Give me a summary", "what's in the pdf?", "Is there a deadline in this document?",
    "According to the file, how much for a hotel in Beijing?", "what does my file say",
    "这文件讲啥", "文件内容是什么", "读一下这个 word 文档", "那份文件说的和公司规定一样吗",
]


def questions(name: str) -> list[str]:
    path = EVAL_SETS / name
    return [json.loads(line)["question"] for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    company = questions("dev.jsonl") + questions("new_wordings.jsonl")
    wrong_company = [q for q in company if refers_to_file(q, FILES)]
    missed = [q for q in FILE_QUESTIONS if not refers_to_file(q, FILES)]
    print(f"company questions taken as about the file: {len(wrong_company)} / {len(company)} "
          f"({100 * len(wrong_company) / len(company):.1f} %)")
    for q in wrong_company:
        print(f"  {q}")
    print(f"file questions recognised as such: {len(FILE_QUESTIONS) - len(missed)} / {len(FILE_QUESTIONS)} "
          f"({100 * (len(FILE_QUESTIONS) - len(missed)) / len(FILE_QUESTIONS):.1f} %)")
    for q in missed:
        print(f"  missed: {q}")


if __name__ == "__main__":
    main()
