"""The course's machinery: running a chapter headless (``chapters``), reading a chapter's sizes
and times (``reading``, ``times``), the ``%%ranks`` magic (``magic``), exporting a chapter's
code (``export``), the ``parlab`` command (``cli``), the exercises' checks (``exercises``) and
the experiments the chapters run beside the planner's predictions (``bench``).

The top floor: it may import the lab and the decision tools.
"""
