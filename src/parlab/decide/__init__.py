"""The decision tools: the guide's strategy rules (``advice``), the planner that prices a layout's
step time and memory under every axis (``planner``; chapter 10's published shapes in ``planner_axes``) and
the widgets that put them in a notebook (``widgets``).

The middle floor: it imports the lab (``parlab.lab``), never the course (``parlab.course``).
"""
