"""DeepL's glossary APIs (``service.glossary`` keeps the glossaries), as its clients call them.

v2, a glossary of one language pair: ``POST /v2/glossaries`` (``name``, ``source_lang``,
``target_lang``, ``entries`` as TSV or CSV, ``entries_format``; JSON or form), ``GET
/v2/glossaries``, ``GET /v2/glossaries/{id}``, ``GET /v2/glossaries/{id}/entries`` (TSV),
``DELETE /v2/glossaries/{id}``, ``GET /v2/glossary-language-pairs``.

v3, "multilingual" glossaries of one dictionary per pair: ``POST /v3/glossaries`` (``name``,
``dictionaries``), ``GET /v3/glossaries``, ``GET|PATCH|DELETE /v3/glossaries/{id}`` (PATCH
renames and merges entries into dictionaries), ``GET /v3/glossaries/{id}/entries?source_lang=
&target_lang=``, ``PUT /v3/glossaries/{id}/dictionaries`` (replaces one) and ``DELETE
/v3/glossaries/{id}/dictionaries?source_lang=&target_lang=``. Both versions see the same
glossaries, as DeepL's do. Each belongs to the key that created it. A translation applies one
with ``glossary_id`` (``service.api.deepl``): the dictionary of its pair.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from service.api.deepl import PREFIX, DeepLRoute, key_fields, language_code
from service.glossary import Glossary, GlossaryError, Pair, parse_entries, valid_id
from service.pipeline import PipelineError, glossary_store, owner_of
from service.state import ServiceState

router = APIRouter(prefix=PREFIX, tags=["DeepL-compatible"], route_class=DeepLRoute)
# DeepL's newer glossary routes
v3 = APIRouter(prefix="/v3", tags=["DeepL-compatible"], route_class=DeepLRoute)


def v2_json(glossary: Glossary) -> dict[str, Any]:
    source, target = glossary.pair
    return {"glossary_id": glossary.glossary_id, "name": glossary.name, "ready": True,
            "source_lang": source, "target_lang": target,
            "creation_time": glossary.creation_time, "entry_count": glossary.entry_count}


def v3_json(glossary: Glossary) -> dict[str, Any]:
    return {"glossary_id": glossary.glossary_id, "name": glossary.name,
            "creation_time": glossary.creation_time,
            "dictionaries": [{"source_lang": s, "target_lang": t, "entry_count": len(entries)}
                             for (s, t), entries in glossary.dictionaries.items()]}


def languages(state: ServiceState) -> set[str]:
    """The languages glossaries may be made for: every language a loaded bundle translates
    from or into."""
    return {code for pair in state.pairs for code in pair}


def _pair(state: ServiceState, fields: dict[str, Any]) -> Pair:
    known = languages(state)
    pair = []
    for side in ("source_lang", "target_lang"):
        code = language_code(str(fields.get(side) or ""))
        if code not in known:
            raise PipelineError("invalid_field", f"Value for '{side}' not supported.", side)
        pair.append(code)
    if pair[0] == pair[1]:
        raise PipelineError("invalid_field", "Value for 'target_lang' not supported: the same "
                            "as source_lang.", "target_lang")
    return pair[0], pair[1]


def _entries(state: ServiceState, fields: dict[str, Any]) -> dict[str, str]:
    limit = state.settings.max_glossary_entries
    try:
        return parse_entries(str(fields.get("entries") or ""),
                             str(fields.get("entries_format") or "tsv").lower(), limit)
    except GlossaryError as exc:
        code = "too_many_glossary_entries" if "MAX_GLOSSARY" in str(exc) else "invalid_field"
        raise PipelineError(code, f"Invalid glossary entries provided: {exc}",
                            "entries") from None


def _name(fields: dict[str, Any]) -> str:
    name = str(fields.get("name") or "").strip()
    if not name:
        raise PipelineError("missing_field", "Parameter 'name' not specified.", "name")
    return name


def _dictionaries(state: ServiceState, fields: dict[str, Any]) -> dict[Pair, dict[str, str]]:
    """v3's ``dictionaries``: a list of {source_lang, target_lang, entries, entries_format}."""
    given = fields.get("dictionaries")
    if not isinstance(given, list) or not all(isinstance(d, dict) for d in given):
        raise PipelineError("invalid_field", "Value for 'dictionaries' not supported: a list "
                            "of objects.", "dictionaries")
    dictionaries: dict[Pair, dict[str, str]] = {}
    for dictionary in given:
        pair = _pair(state, dictionary)
        if pair in dictionaries:
            raise PipelineError("invalid_field", f"Two dictionaries for {pair[0]}->{pair[1]}.",
                                "dictionaries")
        dictionaries[pair] = _entries(state, dictionary)
    return dictionaries


async def _create(request: Request, dictionaries_of) -> Glossary:
    state: ServiceState = request.app.state.service
    fields, key = await key_fields(request, state)
    name = _name(fields)
    # In a thread: 100,000 entries take a second to read and check, which on the event loop
    # would hold every other request (and /health) that long.
    dictionaries = await asyncio.to_thread(dictionaries_of, state, fields)
    owner = owner_of(state, key)
    limit = state.settings.max_glossaries
    if await glossary_store(state).count(owner) >= limit:
        raise PipelineError("too_many_glossaries", f"at most {limit} (MAX_GLOSSARIES); "
                            "delete one first.", "name")
    return await glossary_store(state).create(name, dictionaries, owner)


async def _listed(request: Request) -> list[Glossary]:
    """The caller's glossaries."""
    state: ServiceState = request.app.state.service
    _, key = await key_fields(request, state)
    return await glossary_store(state).list(owner_of(state, key))


async def _glossary(request: Request, glossary_id: str) -> tuple[Glossary, dict[str, Any]]:
    """The caller's glossary ``glossary_id`` (400 for an id of another form, 404 for none),
    and the request's fields."""
    state: ServiceState = request.app.state.service
    fields, key = await key_fields(request, state)
    if not valid_id(glossary_id):
        raise PipelineError("invalid_field", "Invalid glossary ID.", "glossary_id",
                            value=glossary_id)
    glossary = await glossary_store(state).get(glossary_id, owner_of(state, key))
    if glossary is None:
        raise PipelineError("glossary_not_found", "Glossary not found.", "glossary_id",
                            value=glossary_id)
    return glossary, fields


def _single(glossary: Glossary) -> Glossary:
    """A glossary v2 can show: of one dictionary."""
    if len(glossary.dictionaries) != 1:
        raise PipelineError("invalid_field", "The glossary has several dictionaries: use "
                            "/v3/glossaries.", "glossary_id")
    return glossary


# -- v2 --------------------------------------------------------------------------------------

@router.post("/glossaries", status_code=201)
async def create(request: Request) -> Response:
    """DeepL's ``POST /v2/glossaries``."""
    glossary = await _create(request, lambda state, fields: {
        _pair(state, fields): _entries(state, fields)})
    return JSONResponse(v2_json(glossary), status_code=201)


@router.get("/glossaries")
async def list_glossaries(request: Request) -> Response:
    """DeepL's ``GET /v2/glossaries``: the caller's glossaries of one dictionary."""
    glossaries = await _listed(request)
    return JSONResponse({"glossaries": [v2_json(g) for g in glossaries
                                        if len(g.dictionaries) == 1]})


@router.get("/glossaries/{glossary_id}")
async def get(request: Request, glossary_id: str) -> Response:
    """DeepL's ``GET /v2/glossaries/{id}``."""
    glossary, _ = await _glossary(request, glossary_id)
    return JSONResponse(v2_json(_single(glossary)))


@router.get("/glossaries/{glossary_id}/entries")
async def entries(request: Request, glossary_id: str) -> Response:
    """DeepL's ``GET /v2/glossaries/{id}/entries``: TSV, one entry a line."""
    glossary, _ = await _glossary(request, glossary_id)
    glossary = _single(glossary)
    tsv = await asyncio.to_thread(glossary.entries_tsv, glossary.pair)  # 100,000 lines: 50 ms
    return Response(tsv, media_type="text/tab-separated-values")


@router.delete("/glossaries/{glossary_id}", status_code=204)
async def delete(request: Request, glossary_id: str) -> Response:
    """DeepL's ``DELETE /v2/glossaries/{id}``."""
    state: ServiceState = request.app.state.service
    glossary, _ = await _glossary(request, glossary_id)
    await glossary_store(state).delete(glossary.glossary_id, glossary.owner)
    return Response(status_code=204)


@router.get("/glossary-language-pairs")
async def language_pairs(request: Request) -> Response:
    """DeepL's ``GET /v2/glossary-language-pairs``: every pair of two different languages
    the loaded bundles know."""
    state: ServiceState = request.app.state.service
    await key_fields(request, state)
    known = sorted(languages(state))
    return JSONResponse({"supported_languages": [
        {"source_lang": source, "target_lang": target}
        for source in known for target in known if source != target]})


# -- v3 --------------------------------------------------------------------------------------

@v3.post("/glossaries", status_code=201)
async def create_v3(request: Request) -> Response:
    """DeepL's ``POST /v3/glossaries``."""
    glossary = await _create(request, _dictionaries)
    return JSONResponse(v3_json(glossary), status_code=201)


@v3.get("/glossaries")
async def list_v3(request: Request) -> Response:
    """DeepL's ``GET /v3/glossaries``: all the caller's glossaries."""
    glossaries = await _listed(request)
    return JSONResponse({"glossaries": [v3_json(g) for g in glossaries]})


@v3.get("/glossaries/{glossary_id}")
async def get_v3(request: Request, glossary_id: str) -> Response:
    """DeepL's ``GET /v3/glossaries/{id}``."""
    glossary, _ = await _glossary(request, glossary_id)
    return JSONResponse(v3_json(glossary))


@v3.patch("/glossaries/{glossary_id}")
async def update_v3(request: Request, glossary_id: str) -> Response:
    """DeepL's ``PATCH /v3/glossaries/{id}``: a new ``name``, and ``dictionaries`` whose
    entries are merged into the glossary's (new pairs added, a source term's target
    replaced)."""
    state: ServiceState = request.app.state.service
    glossary, fields = await _glossary(request, glossary_id)
    name = _name(fields) if "name" in fields else glossary.name
    dictionaries = {pair: dict(entries) for pair, entries in glossary.dictionaries.items()}
    if "dictionaries" in fields:
        given = await asyncio.to_thread(_dictionaries, state, fields)
        for pair, entries in given.items():
            merged = dictionaries.setdefault(pair, {})
            merged.update(entries)
            if len(merged) > state.settings.max_glossary_entries:
                raise PipelineError("too_many_glossary_entries", "at most "
                                    f"{state.settings.max_glossary_entries} entries "
                                    "(MAX_GLOSSARY_ENTRIES).", "dictionaries")
    saved = await glossary_store(state).save(dataclasses.replace(glossary, name=name,
                                                      dictionaries=dictionaries))
    return JSONResponse(v3_json(saved))


def _query_pair(state: ServiceState, request: Request) -> Pair:
    return _pair(state, dict(request.query_params))


@v3.get("/glossaries/{glossary_id}/entries")
async def entries_v3(request: Request, glossary_id: str) -> Response:
    """DeepL's ``GET /v3/glossaries/{id}/entries?source_lang=&target_lang=``: that
    dictionary's entries as TSV in JSON."""
    state: ServiceState = request.app.state.service
    glossary, _ = await _glossary(request, glossary_id)
    pair = _query_pair(state, request)
    if pair not in glossary.dictionaries:
        raise PipelineError("glossary_not_found", "Glossary dictionary not found.",
                            "source_lang")
    tsv = await asyncio.to_thread(glossary.entries_tsv, pair)  # 100,000 lines: 50 ms
    return JSONResponse({"dictionaries": [{
        "source_lang": pair[0], "target_lang": pair[1], "entries": tsv,
        "entries_format": "tsv"}]})


@v3.put("/glossaries/{glossary_id}/dictionaries")
async def replace_dictionary(request: Request, glossary_id: str) -> Response:
    """DeepL's ``PUT /v3/glossaries/{id}/dictionaries``: one pair's entries replaced (or
    the pair added)."""
    state: ServiceState = request.app.state.service
    glossary, fields = await _glossary(request, glossary_id)
    pair = _pair(state, fields)
    entries = await asyncio.to_thread(_entries, state, fields)
    await glossary_store(state).save(dataclasses.replace(
        glossary, dictionaries={**glossary.dictionaries, pair: entries}))
    return JSONResponse({"source_lang": pair[0], "target_lang": pair[1],
                         "entry_count": len(entries)})


@v3.delete("/glossaries/{glossary_id}/dictionaries", status_code=204)
async def delete_dictionary(request: Request, glossary_id: str) -> Response:
    """DeepL's ``DELETE /v3/glossaries/{id}/dictionaries?source_lang=&target_lang=``."""
    state: ServiceState = request.app.state.service
    glossary, _ = await _glossary(request, glossary_id)
    pair = _query_pair(state, request)
    if pair not in glossary.dictionaries:
        raise PipelineError("glossary_not_found", "Glossary dictionary not found.",
                            "source_lang")
    rest = {p: e for p, e in glossary.dictionaries.items() if p != pair}
    if rest:
        await glossary_store(state).save(dataclasses.replace(glossary, dictionaries=rest))
    else:  # a glossary of no dictionary is none
        await glossary_store(state).delete(glossary.glossary_id, glossary.owner)
    return Response(status_code=204)


@v3.delete("/glossaries/{glossary_id}", status_code=204)
async def delete_v3(request: Request, glossary_id: str) -> Response:
    """DeepL's ``DELETE /v3/glossaries/{id}``."""
    return await delete(request, glossary_id)
