"""The XML parser every document format reads with."""

from __future__ import annotations

from lxml import etree

# A parser that resolves no entity and reads no DTD or network resource.
SAFE_XML = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                       huge_tree=False, remove_blank_text=False)

