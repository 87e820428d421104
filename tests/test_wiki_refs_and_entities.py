"""Wiki markup: a citation <ref>...</ref> spanning lines is dropped whole, and HTML entities
(&nbsp; &ndash; &amp; ...) become their characters — in a hand-written article, through a dump's
XML layer, and over the real Wikipedia sample gensim ships (where 475 sentences kept an entity
and multi-line citations leaked "CHESHIRE BOOKS" and the like when they were not)."""

from __future__ import annotations

import re

from _text_fixtures import GENSIM_WIKI

from bertgpu.data.corpus import gensim_test_data, iter_documents
from bertgpu.data.wikitext import strip_wiki_markup, wiki_to_sentences

ARTICLE = """Alpha&nbsp;is a letter &ndash; the first.<ref name="a">Smith, John.
The Book of Letters.
Press, 1999.</ref> It comes before beta &amp; gamma.<REF>Jones
page 12</REF>
Then&mdash;delta &#8212; &eacute;t&eacute;."""
SENTENCES = ["Alpha is a letter \u2013 the first.", "It comes before beta & gamma.",
             "Then\u2014delta \u2014 \u00e9t\u00e9."]
ENTITY = re.compile(r"&(?:[A-Za-z]+|#\d+|#x[0-9A-Fa-f]+);")


def test_a_multi_line_ref_is_dropped_and_entities_are_characters():
    assert strip_wiki_markup(ARTICLE) == ("Alpha is a letter \u2013 the first. It comes before "
                                          "beta & gamma.\nThen\u2014delta \u2014 \u00e9t\u00e9.")
    assert wiki_to_sentences(ARTICLE) == SENTENCES


def test_through_a_dumps_xml_layer(tmp_path):
    """In a dump the markup's entities are escaped once more (&amp;nbsp;, &lt;ref&gt;)."""
    escaped = ARTICLE.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    path = tmp_path / "dump.xml"
    path.write_text('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">\n'
                    "<page><title>Alpha</title><ns>0</ns><id>1</id><revision><id>2</id>"
                    f'<text xml:space="preserve">{escaped}</text></revision></page>\n'
                    "</mediawiki>\n", encoding="utf-8")
    assert list(iter_documents([path], fmt="wiki")) == [SENTENCES]


def test_the_gensim_wikipedia_sample_keeps_no_entity_nor_multi_line_citation():
    path = gensim_test_data(GENSIM_WIKI)
    sentences = [s for d in iter_documents([path]) for s in d]
    assert len(sentences) > 20_000
    assert [s for s in sentences if ENTITY.search(s)] == []
    assert sum("\u00a0" in s for s in sentences) == 0  # &nbsp; became a plain space
    assert sum("\u2013" in s for s in sentences) > 100  # &ndash; became the dash
    for leaked in ("CHESHIRE BOOKS", "The following sources cite anarchism"):  # multi-line refs
        assert not any(leaked in s for s in sentences), leaked
