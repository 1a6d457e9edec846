"""The HTTP side: one module per API shape, each a thin adapter from its requests onto the
pipeline (``service.pipeline``) and back: ``native`` (this service's own), ``libretranslate``
and ``deepl`` (their clients' shapes, field for field). ``fields``, ``replies`` and
``uploads`` hold what they share: a compatible request's fields, the tables from the
pipeline's errors to each API's answers, a document upload. Routes raise; ``service.errors``
answers in the shape of the route's API.
"""
