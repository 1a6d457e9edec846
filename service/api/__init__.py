"""The HTTP side: one module per API shape, each a thin adapter from its requests onto
``Translator.translate`` and back: ``native`` (this service's own), ``libretranslate`` and
``deepl`` (their clients' shapes, field for field); ``shared`` holds what they all use.
"""
