"""Small real-text fixtures for the corpus, tokenizer and prepare tests (no network needed).

Real English comes from Python's own documentation (`pydoc_data.topics`, on every machine);
a tiny hand-written MediaWiki dump exercises the markup stripper.
"""

from __future__ import annotations

import bz2
import re
from pathlib import Path

from bertgpu.data.corpus import WIKI_SAMPLE
from bertgpu.data.textio import split_sentences

GENSIM_WIKI = WIKI_SAMPLE

# Lines with non-ASCII scripts so that the tokenizer sees CJK characters and accents.
EXTRA_SENTENCES = [
    "我爱自然语言处理。",
    "自然语言处理很有趣。",
    "Crème brûlée, café au lait and a naïve résumé.",
    "Ünïcödé text from Zürich and São Paulo.",
    "東京 is the capital of Japan.",
]


def pydoc_documents(limit: int | None = None) -> list[list[str]]:
    """The Python reference topics as documents of sentences (79 documents, ~100k tokens)."""
    from pydoc_data.topics import topics

    docs = []
    for name in sorted(topics)[:limit]:
        paragraphs = re.split(r"\n\s*\n", topics[name])
        sents = [s for p in paragraphs for s in split_sentences(" ".join(p.split()))]
        if sents:
            docs.append(sents)
    return docs


def write_sentences(path: Path, docs: list[list[str]]) -> Path:
    """Write documents in the one-sentence-per-line, blank-line-between-documents format."""
    path.write_text("".join("\n".join(d) + "\n\n" for d in docs), encoding="utf-8")
    return path


def tokenizer_corpus(folder: Path) -> Path:
    """A sentences file for training small tokenizers: pydoc text plus CJK and accented lines."""
    folder.mkdir(parents=True, exist_ok=True)
    return write_sentences(folder / "corpus.txt", pydoc_documents() + [EXTRA_SENTENCES] * 3)


def train_small_tokenizer(folder: Path, vocab_size: int = 2000, lowercase: bool = True) -> Path:
    from bertgpu.data.tokenizer import train_tokenizer

    corpus = tokenizer_corpus(folder.parent / (folder.name + "_corpus"))
    return train_tokenizer([corpus], folder, vocab_size=vocab_size, lowercase=lowercase,
                           min_frequency=1)


WIKI_XML = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10" \
xml:lang="en">
  <siteinfo><sitename>Wikipedia</sitename></siteinfo>
  <page>
    <title>Redirected</title><ns>0</ns><id>1</id>
    <redirect title="Target" />
    <revision><id>11</id><text xml:space="preserve">#REDIRECT [[Target]]</text></revision>
  </page>
  <page>
    <title>Old style redirect</title><ns>0</ns><id>2</id>
    <revision><id>12</id><text xml:space="preserve">#redirect [[Elsewhere]]</text></revision>
  </page>
  <page>
    <title>Wikipedia:About</title><ns>4</ns><id>3</id>
    <revision><id>13</id><text xml:space="preserve">Project page text that is not an article.\
</text></revision>
  </page>
  <page>
    <title>Alpha</title><ns>0</ns><id>4</id>
    <revision><id>14</id><text xml:space="preserve">{{Infobox thing|name={{nested|x}}|size=3}}
'''Alpha''' is the first letter of the [[Greek alphabet|Greek script]]. It comes before \
[[Beta]].&lt;ref name="a"&gt;A citation {{cite|x}}&lt;/ref&gt;
[[File:Alpha.png|thumb|A picture with a [[caption link]] inside [sic].]]

== History ==
The letter was used in [http://example.org ancient times] and ''later'' periods.
{| class="wikitable"
|-
! Header
|-
| table cell text
|}
* First list item about alpha.
# Second list item.
[[Category:Letters]]
[[de:Alpha]]</text></revision>
  </page>
  <page>
    <title>Beta</title><ns>0</ns><id>5</id>
    <revision><id>15</id><text xml:space="preserve">Beta is the second letter. It follows \
alpha.&lt;br/&gt;Its value is two.</text></revision>
  </page>
</mediawiki>
"""


def write_wiki(path: Path, compress: bool = False) -> Path:
    data = WIKI_XML.encode("utf-8")
    if compress:
        path.write_bytes(bz2.compress(data))
    else:
        path.write_bytes(data)
    return path


# Chinese news-style paragraphs, one per line (the layout of the Chinese corpus).
CHINESE_NEWS = [
    "北京大学和清华大学今天联合发布了一项关于人工智能的研究报告。",
    "报告指出，自然语言处理技术在过去十年里取得了显著的进步。",
    "研究人员认为，预训练语言模型已经成为信息检索和机器翻译的重要工具。",
    "上海市政府宣布将在明年投资建设新的地铁线路，以缓解城市交通压力。",
    "新线路全长约三十公里，预计每天可以运送五十万名乘客。",
    "国家统计局发布的数据显示，今年第三季度国内生产总值同比增长百分之五。",
    "经济学家表示，消费市场的恢复是经济增长的主要动力。",
    "中国科学院的科学家们成功观测到了一颗新的彗星。",
    "这颗彗星距离地球大约两亿公里，将在下个月达到最亮。",
    "天文爱好者可以在晴朗的夜晚用普通望远镜观察它。",
    "教育部发布通知，要求各地学校加强学生的体育锻炼。",
    "专家建议，中小学生每天应当保证一个小时的户外活动时间。",
    "深圳的一家科技公司推出了新款智能手机，受到年轻消费者的欢迎。",
    "这款手机采用了最新的芯片，电池续航时间比上一代提高了百分之二十。",
    "气象部门预报，明天南方地区将出现大范围降雨，请市民注意出行安全。",
    "长江中下游地区的农民正在抓紧时间收割水稻。",
]
