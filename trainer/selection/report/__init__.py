"""What a search leaves: the result (``result.py``: leaderboard, best model, schedule, saved files), its plots
(``plots.py``: Gantt chart, learning curves) and the callbacks called as it runs (``callbacks.py``)."""
