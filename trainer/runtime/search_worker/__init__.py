"""The model-selection worker: the task of a search, one long-lived barrier task per worker.

    search_task -- the barrier task (``selection_task``): its data loaded once, then units of work from the
                   driver's hopper server; the task's model cache and the rows' canonical order
"""
