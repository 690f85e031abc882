"""``gymckpt`` commands on a local stack, one module per thing a reader looks for.

- :mod:`.parsers`: every command's arguments (light: the handlers below are imported only when one runs)
- :mod:`.lifecycle`: ``up``, ``down``, ``restart``, ``status`` (its table: :mod:`.status_table`)
- :mod:`.collect`, :mod:`.jobs`, :mod:`.follow`, :mod:`.job_files`: ``collect``: starting a job, the collection
  server's job API, following the job, and the tasks and results files
- :mod:`.transaction`, :mod:`.checkpoint`, :mod:`.restore`: ``checkpoint`` and ``restore``, over one runner
  (Ctrl-C, the summary, the exit code)
- :mod:`.catalog`: ``checkpoints list/show/delete/prune``
- :mod:`.configs`: the server configs a checkpoint saw, and what changed since
- :mod:`.running`, :mod:`.storage`: what every command needs: the running stack, a coordinator over it, and
  where its checkpoints are
"""
