"""`hyflash simulate`: the phone's loop run on the desktop, and its report.

It sits above both ``hyflash.runtime`` (the engine and backends it runs) and
``hyflash.budget`` (the phone projection it adds with ``--device`` and the tau it
remembers for ``hyflash budget``): ``command`` runs the engines, ``report`` totals and
presents what they measured.
"""
