"""A fit's data: the checks before any cluster work (checks, validation, columns) and the public preparation of a
user's data into the layout a fit reads (prep; a bundled job's own recipes live with the jobs)."""
