"""Generated reports: one run (Markdown + Gantt), side-by-side comparisons (HTML/Markdown), schedule tables."""
