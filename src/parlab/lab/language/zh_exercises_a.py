"""Chinese templates of the course's messages (:mod:`parlab.lab.language`): English template → 中文."""

MESSAGES: dict[str, str] = {}
