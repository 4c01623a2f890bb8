/*
 * test_template.c - the Jinja chat-template engine (src/template/): every
 * rendering in ../shared/templates/expected.jsonl byte for byte (Python
 * Jinja2 3.1.6 as transformers runs it), the built-in templates against the
 * fixtures of the templates they rewrite, Jinja semantics case by case
 * (expected strings from Jinja2 3.1.6), the errors (line:column, unknown
 * filters, raise_exception, runaway templates) with no leaks, and the
 * `switchboard template` command.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "base/base.h"
#include "template/template.h"
#include "testutil.h"

/* ---- helpers --------------------------------------------------------------------- */

static cJSON **lines;
static size_t n_lines;

static int load_expected(void **state) {
    (void)state;
    char *text = sb_test_read_file(sb_test_fixture("templates/expected.jsonl"), NULL);
    if (!text)
        return -1;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        lines = realloc(lines, (n_lines + 1) * sizeof(*lines));
        lines[n_lines] = cJSON_Parse(line);
        if (!lines[n_lines++])
            return -1;
    }
    free(text);
    return 0;
}

static int free_expected(void **state) {
    (void)state;
    for (size_t i = 0; i < n_lines; i++)
        cJSON_Delete(lines[i]);
    free(lines);
    return 0;
}

static const char *str_field(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* JSON text of a field (NULL if absent or null); caller frees. */
static char *json_field(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return v && !cJSON_IsNull(v) ? cJSON_PrintUnformatted(v) : NULL;
}

/* Renders src with the inputs of an expected.jsonl line. */
static sb_status render_line(const char *src, const cJSON *line, char **out, sb_error *err) {
    sb_tpl *tpl;
    sb_status st = sb_tpl_parse(src, strlen(src), &tpl, err);
    if (st)
        return st;
    char *messages = json_field(line, "messages"), *tools = json_field(line, "tools");
    sb_tpl_chat chat = {
        .messages_json = messages,
        .tools_json = tools,
        .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(line, "add_generation_prompt")),
        .bos_token = str_field(line, "bos_token"),
        .eos_token = str_field(line, "eos_token"),
        .now = str_field(line, "now"),
    };
    st = sb_tpl_render_chat(tpl, &chat, out, NULL, err);
    cJSON_free(messages);
    cJSON_free(tools);
    sb_tpl_free(tpl);
    return st;
}

static char *read_template(const char *name) {
    char rel[256];
    snprintf(rel, sizeof(rel), "templates/%s", name);
    char *src = sb_test_read_file(sb_test_fixture(rel), NULL);
    assert_non_null(src);
    return src;
}

/* Prints where got and want first differ. */
static void show_diff(const char *what, const char *got, const char *want) {
    size_t i = 0;
    while (got[i] && got[i] == want[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "%s: differs at byte %zu\n  got:  ...%.80s\n  want: ...%.80s\n", what, i, got + from, want + from);
}

/* ---- the fixtures ---------------------------------------------------------------- */

static void test_expected_jsonl(void **state) {
    (void)state;
    size_t pass = 0;
    for (size_t i = 0; i < n_lines; i++) {
        const cJSON *line = lines[i];
        const char *name = str_field(line, "template"), *want = str_field(line, "output");
        char *src = read_template(name), *got = NULL;
        sb_error err = {0};
        sb_test_count_allocs_begin();
        sb_status st = render_line(src, line, &got, &err);
        char what[256];
        snprintf(what, sizeof(what), "%s / %s", name, str_field(line, "case"));
        if (st)
            fprintf(stderr, "%s: %s\n", what, err.msg);
        else if (strcmp(got, want) != 0)
            show_diff(what, got, want);
        else
            pass++;
        sb_free(got);
        sb_test_count_allocs_end();
        assert_int_equal(sb_test_live_bytes(), 0);
        free(src);
    }
    fprintf(stderr, "expected.jsonl: %zu/%zu renderings byte-identical\n", pass, n_lines);
    assert_int_equal(pass, n_lines);
}

/* ---- Jinja semantics, case by case ------------------------------------------------- */

/* Variables of every case (as extra keyword arguments). */
static const char case_vars[] =
    "{\"d\": {\"b\": 2, \"a\": [1, 2.5, null, true, \"x\"], \"c\": {\"k\": \"v\"}}, \"s\": \"  H\303\251llo W\303\266rld \360\237\230\200 \", \"l\": [3, 1, 2], \"names\": [\"bob\", \"Alice\", \"carol\"], \"people\": [{\"name\": \"Ann\", \"age\": 30, \"role\": \"user\"}, {\"name\": \"Bo\", \"age\": 25, \"role\": \"assistant\"}, {\"name\": \"Cy\", \"role\": \"user\"}], \"q\": \"it's \\\"quoted\\\"\\n\\ttab\", \"e\": \"\", \"n\": null, \"f\": 2.0, \"i\": -7, \"big\": 12345678901234}";

/* Template and Jinja2 3.1.6's rendering (transformers' environment; messages
 * empty, add_generation_prompt true, bos "<s>", eos "</s>", case_vars). */
static const struct {
    const char *src, *want;
} cases[] = {
    {"a\n  {% if true %}\n  b\n  {% endif %}\nc",
     "a\n  b\nc"},
    {"a  {%- if true -%}  b  {%- endif -%}  c",
     "abc"},
    {"a\n{%+ if true +%}\nb\n{% endif %}\n",
     "a\n\nb\n"},
    {"{# comment #}\nx {#- c -#} y\n  {# indented comment #}\nz",
     "xy\nz"},
    {"{% raw %}{{ not rendered }}{% endraw %}\n{{ 1 }}",
     "{{ not rendered }}1"},
    {"  {{ 'var keeps indent' }}\n{{- ' joined' }}",
     "  var keeps indent joined"},
    {"{% for i in l %}\n  {{ i }}\n{% endfor %}",
     "  3\n  1\n  2\n"},
    {"{{ 1.0 }} {{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ -0.0 }} {{ 1e-5 }} {{ 0.0001 }} {{ 123456789.0 }} {{ 2.5e-10 }}",
     "1.0 1e+20 1e+16 1000000000000000.0 0.30000000000000004 0.3333333333333333 -0.0 1e-05 0.0001 123456789.0 2.5e-10"},
    {"{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
     "3 -4 2 -2 1024 0.5 3.5 2.0 3.0 0.5"},
    {"{{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1.5e3 }} {{ 3 * 'ab' }} {{ [1] * 3 }} {{ true + 1 }} {{ -i }} {{ +f }}",
     "1000 31 15 5 1500.0 ababab [1, 1, 1] 2 7 2.0"},
    {"{{ 'a\\tb\\n\\x41\\u00e9\\\\ \\'q\\' \\d' }}|{{ \"dq\" 'adj' }}",
     "a\tb\nA\303\251\\ 'q' \\d|dqadj"},
    {"{{ none }} {{ true }} {{ False }} {{ [] }} {{ {} }} {{ () }} {{ (1,) }} {{ (1, 'a') }} {{ [1, 'a', none, true, 2.0] }}",
     "None True False [] {} () (1,) (1, 'a') [1, 'a', None, True, 2.0]"},
    {"{{ d }} {{ q }} {{ [q] }} {{ {'k': q} }} {{ ['it\\'s'] }} {{ ['say \"hi\"'] }} {{ ['both \\' \"'] }}",
     "{'b': 2, 'a': [1, 2.5, None, True, 'x'], 'c': {'k': 'v'}} it's \"quoted\"\n\ttab ['it\\'s \"quoted\"\\n\\ttab'] {'k': 'it\\'s \"quoted\"\\n\\ttab'} [\"it's\"] ['say \"hi\"'] ['both \\' \"']"},
    {"{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ q|tojson }}|{{ s|tojson }}|{{ s|tojson(ensure_ascii=true) }}",
     "{\"b\": 2, \"a\": [1, 2.5, null, true, \"x\"], \"c\": {\"k\": \"v\"}}|{\n  \"b\": 2,\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true,\n    \"x\"\n  ],\n  \"c\": {\n    \"k\": \"v\"\n  }\n}|{\"a\": [1, 2.5, null, true, \"x\"], \"b\": 2, \"c\": {\"k\": \"v\"}}|\"it's \\\"quoted\\\"\\n\\ttab\"|\"  H\303\251llo W\303\266rld \360\237\230\200 \"|\"  H\\u00e9llo W\\u00f6rld \\ud83d\\ude00 \""},
    {"{{ d|tojson(separators=(',', ':')) }}|{{ [] | tojson(indent=2) }}|{{ {'a': {}}|tojson(indent=1) }}|{{ f|tojson }}|{{ big|tojson }}|{{ n|tojson }}",
     "{\"b\":2,\"a\":[1,2.5,null,true,\"x\"],\"c\":{\"k\":\"v\"}}|[]|{\n \"a\": {}\n}|2.0|12345678901234|null"},
    {"{{ s[2:7] }}|{{ s[::-1] }}|{{ s[-3:] }}|{{ l[::2] }}|{{ l[1:] }}|{{ l[:-1] }}|{{ l[5:] }}|{{ s[3] }}|{{ l[-1] }}|{{ names.1 }}|{{ (1,2,3)[1:] }}",
     "H\303\251llo| \360\237\230\200 dlr\303\266W oll\303\251H  | \360\237\230\200 |[3, 2]|[1, 2]|[3, 1]|[]|\303\251|2|Alice|(2, 3)"},
    {"{{ d.a.0 }}|{{ d['c']['k'] }}|{{ d.zz }}|{{ d['zz'] is defined }}|{{ l[10] is defined }}|{{ d.items is defined }}|{{ d.c.k.upper() }}",
     "1|v||False|False|True|V"},
    {"{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ (1,2) == [1,2] }} {{ 'x' in 'xyz' }} {{ 'b' in d }} {{ 5 not in l }} {{ none == none }}",
     "True False True True True True False True True True True"},
    {"{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ [] or none }} {{ e or [] }} {{ not e }} {{ 'y' if l else 'n' }} [{{ 'y' if e }}] {{ d.zz or 'dflt' }}",
     "x b None [] True y [] dflt"},
    {"{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
     "1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|"},
    {"{% for x in l %}[{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}]{% endfor %}",
     "[<3>1][3<1>2][1<2>]"},
    {"{% for x in l if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}",
     "3:1/2 2:2/2 |empty"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for c in 'h\303\251y' %}{{ c }}.{% endfor %}",
     "b=2;a=[1, 2.5, None, True, 'x'];c={'k': 'v'};|bac|h.\303\251.y."},
    {"{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     "3"},
    {"{% for a in [1,2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }} {% endfor %}",
     "1x11y21 2x12y22 "},
    {"{% set x = 5 %}{% for i in l %}{{ x }}{% set x = i %}{{ x }},{% endfor %}{{ x }}",
     "53,51,52,5"},
    {"{% for x in undefined_thing %}never{% endfor %}ok",
     "ok"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (3, 4) %}{% set c, e2 = t %}{{ c }}{{ e2 }}",
     "1234"},
    {"{% set ns = namespace(n=0, items=[]) %}{% for x in l %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }} {{ ns.items }} {{ ns.missing is defined }}",
     "6 [] False"},
    {"{% set body %}  Hello {{ 'block' }}  {% endset %}[{{ body }}]{% set t2 | upper | trim %} shout {% endset %}[{{ t2 }}]",
     "[  Hello block  ][SHOUT]"},
    {"{% filter upper %}abc {{ 'def' }}{% endfilter %}|{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}",
     "ABC DEF|3"},
    {"{% if false %}a{% elif none %}b{% elif 'x' %}c{% else %}d{% endif %}",
     "c"},
    {"{% macro m(a, b='B', c=none) %}[{{ a }}|{{ b }}|{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m(a='x', b='y') }}{{ m() }}",
     "[1|B|None][1|2|None][1|B|3][x|y|None][|B|None]"},
    {"{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}",
     "120"},
    {"{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner {{ 1 + 1 }}{% endcall %}",
     "<b>inner 2</b>"},
    {"{% macro each(xs) %}{% for x in xs %}{{ caller(x, loop.index) }}{% endfor %}{% endmacro %}{% call(item, i) each(l) %}{{ i }}:{{ item }} {% endcall %}",
     "1:3 2:1 3:2 "},
    {"{% for i in [1, 2] %}{% macro show() %}{{ i }}{% endmacro %}{{ show() }}{% endfor %}",
     "12"},
    {"{% macro g() %}{{ top }}{% endmacro %}{% set top = 'late' %}{{ g() }}",
     "late"},
    {"{{ s|trim }}|{{ 'xxhixx'|trim('x') }}|{{ s|length }}|{{ l|length }}|{{ d|length }}|{{ undefined_x|length }}|{{ l|count }}",
     "H\303\251llo W\303\266rld \360\237\230\200|hi|16|3|3|0|3"},
    {"{{ names|join(', ') }}|{{ people|join('/', attribute='name') }}|{{ l|join }}|{{ [1, none, 'a']|join('-') }}",
     "bob, Alice, carol|Ann/Bo/Cy|312|1-None-a"},
    {"{{ s|upper }}|{{ 'hELLO wORLD-foo_bar x2y'|title }}|{{ 'hELLO'|capitalize }}|{{ 'ABC'|lower }}|{{ q|replace('\\n', ' ') }}|{{ 'aaa'|replace('a', 'b', 2) }}",
     "  H\303\211LLO W\303\226RLD \360\237\230\200 |Hello World-Foo_bar X2y|Hello|abc|it's \"quoted\" \ttab|bba"},
    {"{{ missing|default('dflt') }}|{{ e|default('dflt') }}|{{ e|default('dflt', true) }}|{{ n|default('x') }}|{{ missing|d }}|",
     "dflt||dflt|None||"},
    {"{{ d|items|list }}|{{ l|list }}|{{ 'ab'|list }}|{{ d|list }}|{{ l|first }}|{{ l|last }}|{{ 'xyz'|first }}|{{ []|first is defined }}",
     "[('b', 2), ('a', [1, 2.5, None, True, 'x']), ('c', {'k': 'v'})]|[3, 1, 2]|['a', 'b']|['b', 'a', 'c']|3|2|x|False"},
    {"{{ people|selectattr('role', 'equalto', 'user')|map(attribute='name')|list }}|{{ people|rejectattr('age')|list|length }}|{{ people[:2]|selectattr('age', 'gt', 26)|list|length }}",
     "['Ann', 'Cy']|1|1"},
    {"{{ l|select('odd')|list }}|{{ l|reject('equalto', 2)|list }}|{{ names|map('upper')|list }}|{{ people|map(attribute='age', default=0)|list }}|{{ [1,'a',none]|select|list }}",
     "[3, 1]|[3, 1]|['BOB', 'ALICE', 'CAROL']|[30, 25, 0]|[1, 'a']"},
    {"{{ '42'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '2.5'|float }} {{ 3|float }} {{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 2.1|round(0, 'ceil') }}",
     "42 0 7 3 2.5 3.0 3 2.57 2.0 3.0"},
    {"{{ names|sort }}|{{ names|sort(case_sensitive=true) }}|{{ l|sort(reverse=true) }}|{{ people|sort(attribute='name')|map(attribute='name')|join }}|{{ d|dictsort }}",
     "['Alice', 'bob', 'carol']|['Alice', 'bob', 'carol']|[3, 2, 1]|AnnBoCy|[('a', [1, 2.5, None, True, 'x']), ('b', 2), ('c', {'k': 'v'})]"},
    {"{{ ['a','A','b','a']|unique|list }}|{{ l|sum }}|{{ people[:2]|sum(attribute='age') }}|{{ l|min }}|{{ l|max }}|{{ names|max }}|{{ [1.5, 2]|sum }}",
     "['a', 'b']|6|55|1|3|carol|3.5"},
    {"{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ l|reverse|list }}|{{ 'h\303\251llo'|reverse }}|{{ 1|string }}|{{ 'one two  three'|wordcount }}|{{ '<a&\"b\">'|e }}",
     "a\n    b\n\n    c|  a\n  b|[2, 1, 3]|oll\303\251h|1|3|&lt;a&amp;&#34;b&#34;&gt;"},
    {"{{ l is iterable }}{{ s is string }}{{ d is mapping }}{{ n is none }}{{ 1 is number }}{{ 1.0 is float }}{{ 1 is integer }}{{ true is boolean }}{{ x is undefined }}{{ l is sequence }}{{ d is iterable }}{{ 1 is iterable }}",
     "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalse"},
    {"{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 2 is in l }}{{ 'a' is lower }}{{ 'A' is upper }}{{ true is true }}{{ 0 is false }}{{ false is false }}{{ 1 is eq 1 }}{{ 1 is ne 2 }}{{ 1 is lt 2 }}{{ none is sameas none }}{{ d is callable }}",
     "TrueTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueTrueTrueFalse"},
    {"{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.split(none, 1) }}",
     "H\303\251llo W\303\266rld \360\237\230\200|H\303\251llo W\303\266rld \360\237\230\200 |  H\303\251llo W\303\266rld \360\237\230\200|hi|hi\n|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a', 'b c']"},
    {"{{ s.startswith('  H') }}{{ s.endswith(' ') }}{{ 'abc'.startswith(('x', 'a')) }}|{{ 'hello'.replace('l', 'L') }}|{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}|{{ 'hello world'.title() }}|{{ 'abcabc'.find('c') }}|{{ 'abcabc'.count('b') }}|{{ '-'.join(names) }}",
     "TrueTrueTrue|heLLo|HIhi|Hello World|2|2|bob-Alice-carol"},
    {"{{ d.get('b') }}|{{ d.get('zz') }}|{{ d.get('zz', 'dflt') }}|{{ d.keys()|list }}|{{ d.values()|list|length }}|{{ d.items()|list|first }}",
     "2|None|dflt|['b', 'a', 'c']|3|('b', 2)"},
    {"{{ '</think>' in 'a</think>b' }}|{{ 'x</think>\\n\\nanswer'.split('</think>')[-1].lstrip('\\n') }}|{{ 'a<think>\\nr\\n</think>b'.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
     "True|answer|r"},
    {"{{ range(3)|list }}{{ range(1, 4)|list }}{{ range(10, 0, -3)|list }}|{{ strftime_now('%d %b %Y %H:%M %A %j') }}|{{ dict(a=1, b='x') }}|{{ namespace(a=1).a }}",
     "[0, 1, 2][1, 2, 3][10, 7, 4, 1]|15 Sep 2024 12:00 Sunday 259|{'a': 1, 'b': 'x'}|1"},
    {"[{{ missing }}]{{ missing is defined }}{{ missing ~ 'x' }}{{ missing == missing }}{{ missing != 'a' }}{{ 'a' in missing }}{{ missing|list }}{{ not missing }}",
     "[]FalsexTrueTrueFalse[]True"},
    {"{{ d.zz is none }}{{ d.c.zz is defined }}{{ n.foo is defined }}{{ 'str'.content is defined }}{{ l.zz is defined }}",
     "FalseFalseFalseFalseFalse"},
    {"{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}{{ messages|length }}{{ tools is defined }}",
     "<s></s>True0False"},
    {"x\015\n  {% if true %}\015\n  y\015\n  {% endif %}\015\nz\015\n",
     "x\n  y\nz"},
    {"a\n\t {% if true %}b{% endif %}\n\t{# c #}\nd {% if true %}e{% endif %}\n",
     "a\nbd e"},
    {"{% if true %}\n\n{% endif %}\n{{ 'v' }}\n\n",
     "\nv\n"},
    {"line1\n    {%- if true %}\n    x\n    {%- endif %}\nend",
     "line1    xend"},
    {"{% for m in l -%}\n   {{ m }}\n{%- endfor %}",
     "312"},
    {"{{ '\343\200\200 wide\302\240'|trim }}|{{ 'a\342\200\203b'.split() }}",
     "wide|['a', 'b']"},
    {"{% set x = {'a': 1, 'a': 2, 'b': 3} %}{{ x }}{{ x|length }}",
     "{'a': 2, 'b': 3}2"},
    {"{{ 10000000000000000.0 }} {{ 1.5e300 * 1e10 }} {{ 3.0 * 1 }} {{ 2 ** 62 }} {{ -2 ** 2 }} {{ (-2) ** 2 }} {{ 0.5|string }}",
     "1e+16 inf 3.0 4611686018427387904 4 4 0.5"},
    {"{{ [1, [2, (3, 'x')], {'k': none}] }}|{{ {'a': [1, 2]}|tojson(indent=4) }}",
     "[1, [2, (3, 'x')], {'k': None}]|{\n    \"a\": [\n        1,\n        2\n    ]\n}"},
    {"{{ '\303\205\303\211'|lower }}{{ 'stra\303\237e'|upper }}{{ '\317\211\317\203'|upper }}",
     "\303\245\303\251STRASSE\316\251\316\243"},
    {"{% macro m() %}{{ varx }}{% endmacro %}{% for varx in [1, 2] %}{{ m() }}{% endfor %}",
     ""},
    {"{% set ns = namespace(found=false) %}{% for x in l %}{% if x == 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}",
     "True"},
    {"{{ l|map('string')|join(',') }}|{{ people|map(attribute='name')|map('lower')|join }}",
     "3,1,2|annbocy"},
    {"{% for a, b in [[1, 2], (3, 4)] %}{{ a }}{{ b }}{% endfor %}{% for a, b in ['xy'] %}{{ a }}-{{ b }}{% endfor %}",
     "1234x-y"},
    {"{{ 'abc'[1:] ~ 1 ~ none ~ true }}|{{ 1 ~ 2 }}",
     "bc1NoneTrue|12"},
    {"{{ loop is defined }}{% for x in [1] %}{{ loop is mapping }}{% endfor %}",
     "FalseFalse"},
    {"{% if l|length > 2 and not e and (n is none or false) %}yes{% endif %}",
     "yes"},
    {"{{ (1 if true else 2) + 3 }}{{ 'a' if false else 'b' if true else 'c' }}",
     "4b"},
    {"{{ d['a'][1:3] }}{{ d.a[-1] }}{{ d['b'] + d.a[0] }}",
     "[2.5, None]x3"},
    {"{{ 'x' ~ missing ~ 'y' }}{{ [missing]|length }}",
     "xy1"},
    {"{{ '%s' }}{{ '{' }}{{ '}}' }}{{ '{%' }}",
     "%s{}}{%"},
    {"{% for i in range(3) %}{{ i }}{% if not loop.last %}, {% endif %}{% endfor %}",
     "0, 1, 2"},
    {"{{ '\\u00e9' == '\303\251' }}{{ '\303\251'|length }}{{ '\360\237\230\200'|length }}{{ '\360\237\230\200x'[1] }}",
     "True11x"},
    {"{{ q|tojson|tojson }}",
     "\"\\\"it's \\\\\\\"quoted\\\\\\\"\\\\n\\\\ttab\\\"\""},
    {"{{ [3, 1, 2]|sort|first }}{{ 'b,a'.split(',')|sort|join }}{{ {'b': 1, 'a': 2}|dictsort(by='value')|first }}",
     "1ab('b', 1)"},
    {"{% set t = (1, 2) %}{{ t + (3,) }}{{ t|list + [3] }}{{ t[0] }}",
     "(1, 2, 3)[1, 2, 3]1"},
    {"{{ 5 > 3 == true }}{{ 1 in [1] == true }}",
     "FalseFalse"},
};

/* Renders src with case_vars; returns the status, output in *out (or NULL). */
static sb_status render_src(const char *src, char **out, sb_error *err) {
    sb_tpl *tpl;
    *out = NULL;
    sb_status st = sb_tpl_parse(src, strlen(src), &tpl, err);
    if (st)
        return st;
    sb_tpl_chat chat = {.messages_json = "[]", .extra_json = case_vars, .add_generation_prompt = true,
                        .bos_token = "<s>", .eos_token = "</s>", .now = "2024-09-15T12:00:00"};
    st = sb_tpl_render_chat(tpl, &chat, out, NULL, err);
    sb_tpl_free(tpl);
    return st;
}

static void test_semantics(void **state) {
    (void)state;
    size_t pass = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *got;
        sb_error err = {0};
        sb_test_count_allocs_begin();
        sb_status st = render_src(cases[i].src, &got, &err);
        if (st)
            fprintf(stderr, "case %zu: %s\n  template: %s\n", i, err.msg, cases[i].src);
        else if (strcmp(got, cases[i].want) != 0)
            fprintf(stderr, "case %zu: %s\n  got:  %s\n  want: %s\n", i, cases[i].src, got, cases[i].want);
        else
            pass++;
        sb_free(got);
        sb_test_count_allocs_end();
        assert_int_equal(sb_test_live_bytes(), 0);
    }
    assert_int_equal(pass, sizeof(cases) / sizeof(cases[0]));
}

/* ---- the big templates' other paths --------------------------------------------------- */

/* Fixture templates with keyword arguments and conversations the fixtures
 * do not cover (tools_in_user_message, builtin_tools, enable_thinking,
 * reasoning_effort, <think> content, thinking, richer tool schemas), with
 * Jinja2 3.1.6's renderings. */
static const struct {
    const char *tpl, *messages, *tools, *kwargs;
    bool add_generation_prompt;
    const char *bos, *eos, *want;
} kwarg_cases[] = {
    {"meta-llama-Llama-3.1-8B-Instruct.jinja", "[{\"role\": \"system\", \"content\": \"You are a helpful assistant with tools.\"}, {\"role\": \"user\", \"content\": \"What's the weather in Paris?\"}]",
     "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the current weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, e.g. Paris\"}, \"unit\": {\"type\": \"string\", \"description\": \"Temperature unit\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}]",
     "{\"tools_in_user_message\": false, \"date_string\": \"01 Jan 2025\"}",
     true, "<|begin_of_text|>", "<|eot_id|>",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\nYou have access to the following functions. To call a function, please respond with JSON for a function call.Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        \"description\": \"Get the current weather for a city.\",\n        \"parameters\": {\n            \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n                    \"type\": \"string\",\n                    \"description\": \"City name, e.g. Paris\"\n                },\n                \"unit\": {\n                    \"type\": \"string\",\n                    \"description\": \"Temperature unit\",\n                    \"enum\": [\n                        \"celsius\",\n                        \"fahrenheit\"\n                    ]\n                }\n            },\n            \"required\": [\n                \"city\"\n            ]\n        }\n    }\n}\n\nYou are a helpful assistant with tools.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat's the weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"meta-llama-Llama-3.1-8B-Instruct.jinja", "[{\"role\": \"user\", \"content\": \"What's the weather in Paris?\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call12345\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"call12345\", \"name\": \"get_weather\", \"content\": \"{\\\"temperature\\\": 22, \\\"condition\\\": \\\"sunny\\\"}\"}]",
     "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the current weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, e.g. Paris\"}, \"unit\": {\"type\": \"string\", \"description\": \"Temperature unit\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}]",
     "{\"builtin_tools\": [\"brave_search\", \"code_interpreter\", \"get_weather\"]}",
     true, "<|begin_of_text|>", "<|eot_id|>",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nTools: brave_search, get_weather\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        \"description\": \"Get the current weather for a city.\",\n        \"parameters\": {\n            \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n                    \"type\": \"string\",\n                    \"description\": \"City name, e.g. Paris\"\n                },\n                \"unit\": {\n                    \"type\": \"string\",\n                    \"description\": \"Temperature unit\",\n                    \"enum\": [\n                        \"celsius\",\n                        \"fahrenheit\"\n                    ]\n                }\n            },\n            \"required\": [\n                \"city\"\n            ]\n        }\n    }\n}\n\nWhat's the weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<|python_tag|>get_weather.call(city=\"Paris\", unit=\"celsius\")<|eom_id|><|start_header_id|>ipython<|end_header_id|>\n\n\"{\\\"temperature\\\": 22, \\\"condition\\\": \\\"sunny\\\"}\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"meta-llama-Llama-3.1-8B-Instruct.jinja", "[{\"role\": \"user\", \"content\": \"H\303\251llo w\303\266rld! \344\275\240\345\245\275\357\274\214\344\270\226\347\225\214 \360\237\214\215 \342\200\224 \331\205\330\261\330\255\330\250\330\247\"}, {\"role\": \"assistant\", \"content\": \"\343\201\223\343\202\223\343\201\253\343\201\241\343\201\257\357\274\201\360\237\221\213 \303\207a va? \303\261\"}, {\"role\": \"user\", \"content\": \"Emoji ZWJ: \360\237\221\250\342\200\215\360\237\221\251\342\200\215\360\237\221\247 and flag \360\237\207\257\360\237\207\265\"}]",
     NULL,
     "{\"builtin_tools\": [\"wolfram_alpha\"]}",
     true, "<|begin_of_text|>", "<|eot_id|>",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nTools: wolfram_alpha\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nH\303\251llo w\303\266rld! \344\275\240\345\245\275\357\274\214\344\270\226\347\225\214 \360\237\214\215 \342\200\224 \331\205\330\261\330\255\330\250\330\247<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n\343\201\223\343\202\223\343\201\253\343\201\241\343\201\257\357\274\201\360\237\221\213 \303\207a va? \303\261<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nEmoji ZWJ: \360\237\221\250\342\200\215\360\237\221\251\342\200\215\360\237\221\247 and flag \360\237\207\257\360\237\207\265<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"meta-llama-Llama-3.2-3B-Instruct.jinja", "[{\"role\": \"user\", \"content\": \"What's the weather in Paris?\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call12345\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"call12345\", \"name\": \"get_weather\", \"content\": \"{\\\"temperature\\\": 22, \\\"condition\\\": \\\"sunny\\\"}\"}]",
     "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the current weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, e.g. Paris\"}, \"unit\": {\"type\": \"string\", \"description\": \"Temperature unit\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}]",
     "{\"tools_in_user_message\": false}",
     true, "<|begin_of_text|>", "<|eot_id|>",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 15 Sep 2024\n\nYou have access to the following functions. To call a function, please respond with JSON for a function call.Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        \"description\": \"Get the current weather for a city.\",\n        \"parameters\": {\n            \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n                    \"type\": \"string\",\n                    \"description\": \"City name, e.g. Paris\"\n                },\n                \"unit\": {\n                    \"type\": \"string\",\n                    \"description\": \"Temperature unit\",\n                    \"enum\": [\n                        \"celsius\",\n                        \"fahrenheit\"\n                    ]\n                }\n            },\n            \"required\": [\n                \"city\"\n            ]\n        }\n    }\n}\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat's the weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n\"{\\\"temperature\\\": 22, \\\"condition\\\": \\\"sunny\\\"}\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"Qwen-Qwen3-0.6B.jinja", "[{\"role\": \"system\", \"content\": \"You are a terse assistant.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello. How can I help?\"}, {\"role\": \"user\", \"content\": \"Tell me a joke.\"}]",
     NULL,
     "{\"enable_thinking\": false}",
     true, NULL, "<|im_end|>",
     "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello. How can I help?<|im_end|>\n<|im_start|>user\nTell me a joke.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"},
    {"Qwen-Qwen3-0.6B.jinja", "[{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nhmm\\n</think>\\n\\nHello!\"}, {\"role\": \"user\", \"content\": \"Again\"}]",
     NULL,
     "{}",
     true, NULL, "<|im_end|>",
     "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"},
    {"openai-gpt-oss-120b.jinja", "[{\"role\": \"system\", \"content\": \"You are a helpful assistant with tools.\"}, {\"role\": \"user\", \"content\": \"What's the weather in Paris?\"}]",
     "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the current weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, e.g. Paris\"}, \"unit\": {\"type\": \"string\", \"description\": \"Temperature unit\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}]",
     "{\"reasoning_effort\": \"high\", \"builtin_tools\": [\"browser\", \"python\"], \"model_identity\": \"You are a test.\"}",
     true, "<|startoftext|>", "<|return|>",
     "<|start|>system<|message|>You are a test.\nKnowledge cutoff: 2024-06\nCurrent date: 2024-09-15\n\nReasoning: high\n\n# Tools\n\n## browser\n\n// Tool for browsing.\n// The `cursor` appears in brackets before each browsing display: `[{cursor}]`.\n// Cite information from the tool using the following format:\n// `\343\200\220{cursor}\342\200\240L{line_start}(-L{line_end})?\343\200\221`, for example: `\343\200\2206\342\200\240L9-L11\343\200\221` or `\343\200\2208\342\200\240L3\343\200\221`.\n// Do not quote more than 10 words directly from the tool output.\n// sources=web (default: web)\nnamespace browser {\n\n// Searches for information related to `query` and displays `topn` results.\ntype search = (_: {\nquery: string,\ntopn?: number, // default: 10\nsource?: string,\n}) => any;\n\n// Opens the link `id` from the page indicated by `cursor` starting at line number `loc`, showing `num_lines` lines.\n// Valid link ids are displayed with the formatting: `\343\200\220{id}\342\200\240.*\343\200\221`.\n// If `cursor` is not provided, the most recent page is implied.\n// If `id` is a string, it is treated as a fully qualified URL associated with `source`.\n// If `loc` is not provided, the viewport will be positioned at the beginning of the document or centered on the most relevant passage, if available.\n// Use this function without `id` to scroll to a new location of an opened page.\ntype open = (_: {\nid?: number | string, // default: -1\ncursor?: number, // default: -1\nloc?: number, // default: -1\nnum_lines?: number, // default: -1\nview_source?: boolean, // default: false\nsource?: string,\n}) => any;\n\n// Finds exact matches of `pattern` in the current page, or the page given by `cursor`.\ntype find = (_: {\npattern: string,\ncursor?: number, // default: -1\n}) => any;\n\n} // namespace browser\n\n## python\n\nUse this tool to execute Python code in your chain of thought. The code will not be shown to the user. This tool should be used for internal reasoning, but not for code that is intended to be visible to the user (e.g. when creating plots, tables, or files).\n\nWhen you send a message containing Python code to python, it will be executed in a stateful Jupyter notebook environment. python will respond with the output of the execution or time out after 120.0 seconds. The drive at '/mnt/data' can be used to save and persist user files. Internet access for this session is UNKNOWN. Depends on the cluster.\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant with tools.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n// Get the current weather for a city.\ntype get_weather = (_: {\n// City name, e.g. Paris\ncity: string,\n// Temperature unit\nunit?: \"celsius\" | \"fahrenheit\",\n}) => any;\n\n} // namespace functions<|end|><|start|>user<|message|>What's the weather in Paris?<|end|><|start|>assistant"},
    {"openai-gpt-oss-120b.jinja", "[{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello!\", \"thinking\": \"Let me think.\"}]",
     NULL,
     "{}",
     false, "<|startoftext|>", "<|return|>",
     "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2024-09-15\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>analysis<|message|>Let me think.<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>"},
    {"openai-gpt-oss-120b.jinja", "[{\"role\": \"system\", \"content\": \"Sys.\"}, {\"role\": \"user\", \"content\": \"Find cats\"}]",
     "[{\"type\": \"function\", \"function\": {\"name\": \"search\", \"description\": \"Search the web.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"string\", \"description\": \"What to look for\"}, \"limit\": {\"type\": \"integer\", \"description\": \"Max results\", \"default\": 10}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"description\": \"Filter tags\"}, \"ids\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}}, \"mode\": {\"type\": [\"string\", \"null\"], \"description\": \"Mode\"}, \"opts\": {\"type\": \"object\", \"additionalProperties\": {\"type\": \"number\"}, \"description\": \"Options\"}, \"flag\": {\"type\": \"boolean\", \"description\": \"A flag\", \"nullable\": true}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"], \"default\": \"c\", \"description\": \"Unit\"}}, \"required\": [\"query\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"noargs\", \"description\": \"No arguments.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}]",
     "{}",
     true, "<|startoftext|>", "<|return|>",
     "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2024-09-15\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Instructions\n\nSys.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n// Search the web.\ntype search = (_: {\n// What to look for\nquery: string,\n// Max results\nlimit?: number, // default: 10,\n// Filter tags\ntags?: string[],\nids?: number[],\n// Mode\nmode?: string | null,\n// Options\nopts?: object,\n// A flag\nflag?: boolean,\n// Unit\nunit?: \"c\" | \"f\", // default: c,\n}) => any;\n\n// No arguments.\ntype noargs = () => any;\n\n} // namespace functions<|end|><|start|>user<|message|>Find cats<|end|><|start|>assistant"},
    {"Qwen-Qwen2.5-7B-Instruct.jinja", "[{\"role\": \"system\", \"content\": \"Sys.\"}, {\"role\": \"user\", \"content\": \"Find cats\"}]",
     "[{\"type\": \"function\", \"function\": {\"name\": \"search\", \"description\": \"Search the web.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"string\", \"description\": \"What to look for\"}, \"limit\": {\"type\": \"integer\", \"description\": \"Max results\", \"default\": 10}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"description\": \"Filter tags\"}, \"ids\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}}, \"mode\": {\"type\": [\"string\", \"null\"], \"description\": \"Mode\"}, \"opts\": {\"type\": \"object\", \"additionalProperties\": {\"type\": \"number\"}, \"description\": \"Options\"}, \"flag\": {\"type\": \"boolean\", \"description\": \"A flag\", \"nullable\": true}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"], \"default\": \"c\", \"description\": \"Unit\"}}, \"required\": [\"query\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"noargs\", \"description\": \"No arguments.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}]",
     "{}",
     true, NULL, "<|im_end|>",
     "<|im_start|>system\nSys.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"search\", \"description\": \"Search the web.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"string\", \"description\": \"What to look for\"}, \"limit\": {\"type\": \"integer\", \"description\": \"Max results\", \"default\": 10}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"description\": \"Filter tags\"}, \"ids\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}}, \"mode\": {\"type\": [\"string\", \"null\"], \"description\": \"Mode\"}, \"opts\": {\"type\": \"object\", \"additionalProperties\": {\"type\": \"number\"}, \"description\": \"Options\"}, \"flag\": {\"type\": \"boolean\", \"description\": \"A flag\", \"nullable\": true}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"], \"default\": \"c\", \"description\": \"Unit\"}}, \"required\": [\"query\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"noargs\", \"description\": \"No arguments.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nFind cats<|im_end|>\n<|im_start|>assistant\n"},
    {"mistralai-Mistral-Nemo-Instruct-2407.jinja", "[{\"role\": \"system\", \"content\": \"Sys.\"}, {\"role\": \"user\", \"content\": \"Find cats\"}]",
     "[{\"type\": \"function\", \"function\": {\"name\": \"search\", \"description\": \"Search the web.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"string\", \"description\": \"What to look for\"}, \"limit\": {\"type\": \"integer\", \"description\": \"Max results\", \"default\": 10}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"description\": \"Filter tags\"}, \"ids\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}}, \"mode\": {\"type\": [\"string\", \"null\"], \"description\": \"Mode\"}, \"opts\": {\"type\": \"object\", \"additionalProperties\": {\"type\": \"number\"}, \"description\": \"Options\"}, \"flag\": {\"type\": \"boolean\", \"description\": \"A flag\", \"nullable\": true}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"], \"default\": \"c\", \"description\": \"Unit\"}}, \"required\": [\"query\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"noargs\", \"description\": \"No arguments.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}]",
     "{}",
     true, "<s>", "</s>",
     "<s>[AVAILABLE_TOOLS][{\"type\": \"function\", \"function\": {\"name\": \"search\", \"description\": \"Search the web.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"string\", \"description\": \"What to look for\"}, \"limit\": {\"type\": \"integer\", \"description\": \"Max results\", \"default\": 10}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"description\": \"Filter tags\"}, \"ids\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}}, \"mode\": {\"type\": [\"string\", \"null\"], \"description\": \"Mode\"}, \"opts\": {\"type\": \"object\", \"additionalProperties\": {\"type\": \"number\"}, \"description\": \"Options\"}, \"flag\": {\"type\": \"boolean\", \"description\": \"A flag\", \"nullable\": true}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"], \"default\": \"c\", \"description\": \"Unit\"}}, \"required\": [\"query\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"noargs\", \"description\": \"No arguments.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}][/AVAILABLE_TOOLS][INST]Sys.\n\nFind cats[/INST]"},
    {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "[{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nhmm\\n</think>\\n\\nHello!\"}, {\"role\": \"user\", \"content\": \"Again\"}]",
     NULL,
     "{}",
     true, "<\357\275\234begin\342\226\201of\342\226\201sentence\357\275\234>", "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>",
     "<\357\275\234begin\342\226\201of\342\226\201sentence\357\275\234><\357\275\234User\357\275\234>Hi<\357\275\234Assistant\357\275\234>\n\nHello!<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234><\357\275\234User\357\275\234>Again<\357\275\234Assistant\357\275\234><think>\n"},
};

static void test_kwargs_and_paths(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof(kwarg_cases) / sizeof(kwarg_cases[0]); i++) {
        char *src = read_template(kwarg_cases[i].tpl), *got = NULL;
        sb_tpl *tpl;
        sb_error err = {0};
        assert_int_equal(sb_tpl_parse(src, strlen(src), &tpl, &err), SB_OK);
        sb_tpl_chat chat = {.messages_json = kwarg_cases[i].messages, .tools_json = kwarg_cases[i].tools,
                            .extra_json = kwarg_cases[i].kwargs,
                            .add_generation_prompt = kwarg_cases[i].add_generation_prompt,
                            .bos_token = kwarg_cases[i].bos, .eos_token = kwarg_cases[i].eos,
                            .now = "2024-09-15 12:00"};
        if (sb_tpl_render_chat(tpl, &chat, &got, NULL, &err))
            fail_msg("%s with %s: %s", kwarg_cases[i].tpl, kwarg_cases[i].kwargs, err.msg);
        if (strcmp(got, kwarg_cases[i].want) != 0) {
            show_diff(kwarg_cases[i].tpl, got, kwarg_cases[i].want);
            fail_msg("%s with %s differs from Jinja2", kwarg_cases[i].tpl, kwarg_cases[i].kwargs);
        }
        sb_free(got);
        sb_tpl_free(tpl);
        free(src);
    }
}

/* ---- built-in templates -------------------------------------------------------------- */

/* Each built-in renders like the published template it rewrites, on every
 * fixture case of that template (ChatML: Qwen 2.5's cases that start with a
 * system message and have no tools, where Qwen adds nothing of its own). */
static void test_builtins_match_fixtures(void **state) {
    (void)state;
    static const struct {
        const char *builtin, *fixture;
    } pairs[] = {
        {"llama2", "meta-llama-Llama-2-7b-chat-hf.jinja"},
        {"llama3", "meta-llama-Meta-Llama-3-8B-Instruct.jinja"},
        {"chatml", "Qwen-Qwen2.5-7B-Instruct.jinja"},
        {"mistral", "mistralai-Mistral-7B-Instruct-v0.2.jinja"},
        {"gemma", "google-gemma-2-2b-it.jinja"},
        {"phi3", "microsoft-Phi-3.5-mini-instruct.jinja"},
    };
    for (size_t p = 0; p < sizeof(pairs) / sizeof(pairs[0]); p++) {
        const char *src = sb_tpl_builtin_source(pairs[p].builtin);
        assert_non_null(src);
        size_t checked = 0;
        for (size_t i = 0; i < n_lines; i++) {
            const cJSON *line = lines[i];
            if (strcmp(str_field(line, "template"), pairs[p].fixture) != 0)
                continue;
            const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(line, "messages");
            bool system_first = strcmp(str_field(cJSON_GetArrayItem(msgs, 0), "role"), "system") == 0;
            if (strcmp(pairs[p].builtin, "chatml") == 0 &&
                (!system_first || !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(line, "tools"))))
                continue;
            char *got = NULL;
            sb_error err = {0};
            sb_status st = render_line(src, line, &got, &err);
            if (st)
                fail_msg("%s / %s: %s", pairs[p].builtin, str_field(line, "case"), err.msg);
            if (strcmp(got, str_field(line, "output")) != 0) {
                show_diff(pairs[p].builtin, got, str_field(line, "output"));
                fail_msg("built-in %s differs from %s on %s", pairs[p].builtin, pairs[p].fixture,
                         str_field(line, "case"));
            }
            sb_free(got);
            checked++;
        }
        assert_true(checked >= 2);
    }
    assert_null(sb_tpl_builtin_source("nonesuch"));
}

/* The skipped cases where the template raises: the same message here, for
 * the fixture and for the built-in that rewrites it. */
static void test_skipped_cases_raise(void **state) {
    (void)state;
    char *text = sb_test_read_file(sb_test_fixture("templates/skipped.json"), NULL);
    cJSON *skipped = cJSON_Parse(text);
    free(text);
    assert_non_null(skipped);
    size_t raised = 0;
    const cJSON *entry;
    cJSON_ArrayForEach(entry, skipped) {
        const char *reason = str_field(entry, "reason"), *prefix = "raised TemplateError: ";
        if (strncmp(reason, prefix, strlen(prefix)) != 0)
            continue;
        const char *want = reason + strlen(prefix), *name = str_field(entry, "template");
        const cJSON *line = NULL; /* the same case from any template carries its messages */
        for (size_t i = 0; i < n_lines && !line; i++)
            if (strcmp(str_field(lines[i], "case"), str_field(entry, "case")) == 0)
                line = lines[i];
        assert_non_null(line);
        char *src = read_template(name);
        const char *builtin = sb_tpl_builtin_source(strncmp(name, "google", 6) == 0 ? "gemma" : "mistral");
        const char *sources[] = {src, builtin};
        for (size_t k = 0; k < 2; k++) {
            char *got = NULL;
            sb_error err = {0};
            sb_test_count_allocs_begin();
            sb_status st = render_line(sources[k], line, &got, &err);
            sb_test_count_allocs_end();
            assert_int_equal(sb_test_live_bytes(), 0);
            assert_int_equal(st, SB_ERR_INVALID_ARG);
            assert_null(got);
            if (!strstr(err.msg, want) || strncmp(err.msg, "template:", 9) != 0)
                fail_msg("%s / %s: got '%s', want '%s'", name, str_field(entry, "case"), err.msg, want);
        }
        free(src);
        raised++;
    }
    cJSON_Delete(skipped);
    assert_int_equal(raised, 6);
}

/* ---- errors ----------------------------------------------------------------------------- */

static void test_errors(void **state) {
    (void)state;
    static const struct {
        const char *src;
        sb_status status;
        const char *msg; /* the whole message must contain this */
    } errs[] = {
        /* syntax, with line:column */
        {"hello\n{% if true %}\nno end", SB_ERR_FORMAT, "template:2:4: 'if' block is never closed"},
        {"{{ 1 + }}", SB_ERR_FORMAT, "template:1:8: unexpected end of print statement"},
        {"a\n  {% endfor %}", SB_ERR_FORMAT, "template:2:6: unknown tag 'endfor'"},
        {"{{ 'abc }}", SB_ERR_FORMAT, "template:1:4: unterminated string literal"},
        {"{{ x ]] }}", SB_ERR_FORMAT, "template:1:6: unexpected ]"},
        {"{# open comment", SB_ERR_FORMAT, "template:1:1: missing end of comment tag"},
        {"{{ x", SB_ERR_FORMAT, "template:1:1: '{{' is never closed"},
        {"{% set 1 = 2 %}", SB_ERR_FORMAT, "template:1:8: can't assign"},
        {"{% macro m(a=1, b) %}{% endmacro %}", SB_ERR_FORMAT, "non-default argument follows default argument"},
        {"{{ x is defined is none }}", SB_ERR_FORMAT, "template:1:17: you cannot chain multiple tests with is"},
        {"{{ x is foo }}", SB_ERR_FORMAT, "template:1:6: no test named 'foo'"},
        /* unknown and unsupported constructs */
        {"x\n{{ messages|nosuchfilter }}", SB_ERR_FORMAT, "template:2:13: no filter named 'nosuchfilter'"},
        {"{% if true %}{{ 1|nosuch }}{% endif %}", SB_ERR_INVALID_ARG, "template:1:19: no filter named 'nosuch'"},
        {"{{ s|wordwrap }}", SB_ERR_UNSUPPORTED, "template:1:6: the 'wordwrap' filter is not supported"},
        {"{% extends 'base.html' %}", SB_ERR_UNSUPPORTED, "template:1:4: the 'extends' tag is not supported"},
        {"{% for x in l recursive %}{% endfor %}", SB_ERR_UNSUPPORTED, "recursive for loops are not supported"},
        {"{{ l.append(4) }}", SB_ERR_INVALID_ARG, "unsafe"},
        /* runtime errors, as Jinja2 raises them */
        {"{{ raise_exception('Only user and assistant roles are supported!') }}", SB_ERR_INVALID_ARG,
         "template:1:4: raise_exception: Only user and assistant roles are supported!"},
        {"{{ nope.attr }}", SB_ERR_INVALID_ARG, "template:1:8: 'nope' is undefined"},
        {"{{ d.zz.yy }}", SB_ERR_INVALID_ARG, "'dict object' has no attribute 'zz'"},
        {"{{ 1 + 'a' }}", SB_ERR_INVALID_ARG, "unsupported operand type(s) for +: 'int' and 'str'"},
        {"{{ 'a' + 1 }}", SB_ERR_INVALID_ARG, "can only concatenate str (not \"int\") to str"},
        {"{{ 1 // 0 }}", SB_ERR_INVALID_ARG, "integer division by zero"},
        {"{% for x in n %}{% endfor %}", SB_ERR_INVALID_ARG, "'NoneType' object is not iterable"},
        {"{% set a, b = [1] %}", SB_ERR_INVALID_ARG, "not enough values to unpack (expected 2, got 1)"},
        {"{% set x = 1 %}{% set x.y = 2 %}", SB_ERR_INVALID_ARG, "cannot assign attribute on non-namespace object"},
        {"{{ d|tojson }}{{ missing|tojson }}", SB_ERR_INVALID_ARG, "Object of type Undefined is not JSON serializable"},
        {"{{ s.strip(1, 2) }}", SB_ERR_INVALID_ARG, "strip() takes at most 1 argument(s) (2 given)"},
        {"{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", SB_ERR_INVALID_ARG, "macro 'm' takes no keyword argument 'b'"},
        /* runaway templates */
        {"{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", SB_ERR_UNSUPPORTED, "macro calls nested deeper than"},
        {"{{ 'x' * 100000000 }}", SB_ERR_UNSUPPORTED, "repetition result is too large"},
        {"{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
         SB_ERR_UNSUPPORTED, ""},
        {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", SB_ERR_UNSUPPORTED,
         "evaluation steps"},
        {"{{ range(1000000)|length }}", SB_ERR_UNSUPPORTED, "range() is too big"},
        {"{% set ns = namespace() %}{% set ns.self = [ns] %}", SB_ERR_UNSUPPORTED, "namespace into itself"},
    };
    for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
        char *got;
        sb_error err = {0};
        sb_test_count_allocs_begin();
        sb_status st = render_src(errs[i].src, &got, &err);
        sb_test_count_allocs_end();
        assert_int_equal(sb_test_live_bytes(), 0);
        if (st != errs[i].status || !strstr(err.msg, errs[i].msg))
            fail_msg("'%s': got status %d '%s' (output '%s'), want %d '%s'", errs[i].src, st, err.msg,
                     got ? got : "", errs[i].status, errs[i].msg);
        assert_null(got);
    }
}

/* Deep nesting in any form ends in an error, not a stack overflow. */
static void test_deep_nesting(void **state) {
    (void)state;
    static const char *const units[][3] = {
        {"{{ ", "(", "1) }}"},          {"{{ ", "[", "1] }}"},     {"{{ ", "not ", "1 }}"},
        {"{{ ", "- ", "1 }}"},          {"{{ 1", " + 1", " }}"},   {"{{ x", ".a", " }}"},
        {"{{ x", "|trim", " }}"},       {"", "{% if 1 %}", ""},   {"{{ 1", " if 1 else 1", " }}"},
    };
    for (size_t u = 0; u < sizeof(units) / sizeof(units[0]); u++) {
        size_t reps = 20000, unit = strlen(units[u][1]);
        char *src = malloc(strlen(units[u][0]) + reps * unit + strlen(units[u][2]) + 1);
        strcpy(src, units[u][0]);
        char *p = src + strlen(src);
        for (size_t r = 0; r < reps; r++, p += unit)
            memcpy(p, units[u][1], unit);
        strcpy(p, units[u][2]);
        sb_tpl *tpl;
        sb_error err = {0};
        sb_test_count_allocs_begin();
        sb_status st = sb_tpl_parse(src, strlen(src), &tpl, &err);
        sb_test_count_allocs_end();
        if (st == SB_OK)
            fail_msg("%.40s... (%zu times) parsed", units[u][1], reps);
        assert_int_equal(sb_test_live_bytes(), 0);
        assert_non_null(strstr(err.msg, "template:1:"));
        free(src);
    }
    /* nested JSON input */
    char deep[5000];
    memset(deep, '[', 2000);
    memset(deep + 2000, ']', 2000);
    deep[4000] = '\0';
    sb_tpl *tpl;
    sb_error err = {0};
    assert_int_equal(sb_tpl_parse("{{ messages }}", 14, &tpl, &err), SB_OK);
    sb_tpl_chat chat = {.messages_json = deep};
    char *out;
    assert_int_equal(sb_tpl_render_chat(tpl, &chat, &out, NULL, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "messages: invalid JSON at line 1 column"));
    chat.messages_json = "[{\"role\": \"user\"}";
    assert_int_equal(sb_tpl_render_chat(tpl, &chat, &out, NULL, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "messages: invalid JSON at line 1 column 18"));
    chat.messages_json = "[]";
    chat.now = "2024-13-01";
    assert_int_equal(sb_tpl_render_chat(tpl, &chat, &out, NULL, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "now:"));
    sb_tpl_free(tpl);
}

/* One parsed template rendered repeatedly gives the same bytes. */
static void test_parse_once_render_many(void **state) {
    (void)state;
    char *src = read_template("openai-gpt-oss-120b.jinja");
    const cJSON *line = NULL;
    for (size_t i = 0; i < n_lines && !line; i++)
        if (strcmp(str_field(lines[i], "template"), "openai-gpt-oss-120b.jinja") == 0 &&
            strcmp(str_field(lines[i], "case"), "tool_call_and_result") == 0)
            line = lines[i];
    assert_non_null(line);
    sb_tpl *tpl;
    sb_error err = {0};
    assert_int_equal(sb_tpl_parse(src, strlen(src), &tpl, &err), SB_OK);
    char *messages = json_field(line, "messages"), *tools = json_field(line, "tools");
    sb_tpl_chat chat = {.messages_json = messages, .tools_json = tools, .add_generation_prompt = true,
                        .now = "2024-09-15 12:00"};
    for (int r = 0; r < 3; r++) {
        char *out;
        size_t len;
        assert_int_equal(sb_tpl_render_chat(tpl, &chat, &out, &len, &err), SB_OK);
        assert_int_equal(len, strlen(str_field(line, "output")));
        assert_string_equal(out, str_field(line, "output"));
        sb_free(out);
    }
    cJSON_free(messages);
    cJSON_free(tools);
    sb_tpl_free(tpl);
    free(src);
}

/* ---- the command ------------------------------------------------------------------------- */

static char *write_tmp(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", sb_test_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return strdup(path);
}

/* `switchboard template` prints exactly the rendering: from a template file,
 * and from GGUF models whose chat_template is a fixture template (the Llama 3
 * vocabulary model carries Llama 3.2's, the Qwen2 one Qwen 2.5's). */
static void test_cli(void **state) {
    (void)state;
    static const struct {
        const char *fixture, *model; /* model: NULL = use --file */
    } runs[] = {
        {"google-gemma-3-it.jinja", NULL},
        {"meta-llama-Llama-3.2-3B-Instruct.jinja", "models/llama3-vocab-tiny-random.gguf"},
        {"Qwen-Qwen2.5-7B-Instruct.jinja", "models/qwen2-vocab-tiny-random.gguf"},
    };
    size_t checked = 0;
    for (size_t r = 0; r < sizeof(runs) / sizeof(runs[0]); r++) {
        char rel[256];
        snprintf(rel, sizeof(rel), "templates/%s", runs[r].fixture);
        char *tpl_path = strdup(sb_test_fixture(rel));
        char *model = runs[r].model ? strdup(sb_test_fixture(runs[r].model)) : NULL;
        for (size_t i = 0; i < n_lines; i++) {
            const cJSON *line = lines[i];
            if (strcmp(str_field(line, "template"), runs[r].fixture) != 0)
                continue;
            char *messages = json_field(line, "messages"), *tools = json_field(line, "tools");
            char *msg_path = write_tmp("messages.json", messages), *tools_path = tools ? write_tmp("tools.json", tools) : NULL;
            const char *args[20] = {"template", model ? "-m" : "--file", model ? model : tpl_path, "--messages",
                                    msg_path, "--now", "2024-09-15 12:00"};
            size_t n = 7;
            if (tools_path) {
                args[n++] = "--tools";
                args[n++] = tools_path;
            }
            if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(line, "add_generation_prompt")))
                args[n++] = "--no-generation-prompt";
            if (!model) {
                args[n++] = "--bos";
                args[n++] = str_field(line, "bos_token");
                args[n++] = "--eos";
                args[n++] = str_field(line, "eos_token");
            }
            args[n] = NULL;
            char *out, *err;
            int rc = sb_test_run_cli(args, &out, &err);
            if (rc != 0 || strcmp(out, str_field(line, "output")) != 0)
                fail_msg("switchboard template (%s / %s) exited %d: %s\n%s", runs[r].fixture,
                         str_field(line, "case"), rc, err, out);
            free(out);
            free(err);
            free(messages);
            free(tools);
            free(msg_path);
            free(tools_path);
            checked++;
        }
        free(tpl_path);
        free(model);
    }
    assert_true(checked >= 20);

    /* a built-in, and errors: one line naming file:line:column, exit status 1 */
    char *msg_path = write_tmp("messages.json", "[{\"role\": \"system\", \"content\": \"s\"}, "
                                                "{\"role\": \"user\", \"content\": \"Hi\"}]");
    char *bad_path = write_tmp("bad.jinja", "ok\n{{ messages|nosuch }}");
    char *out, *err;
    const char *builtin[] = {"template", "--builtin", "chatml", "--messages", msg_path, NULL};
    assert_int_equal(sb_test_run_cli(builtin, &out, &err), 0);
    assert_string_equal(out, "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    free(err);
    const char *raises[] = {"template", "--builtin", "gemma", "--messages", msg_path, NULL};
    assert_int_equal(sb_test_run_cli(raises, &out, &err), 1);
    assert_string_equal(out, "");
    assert_non_null(strstr(err, "switchboard: error: gemma:2:"));
    assert_non_null(strstr(err, "System role not supported"));
    free(out);
    free(err);
    const char *bad[] = {"template", "--file", bad_path, "--messages", msg_path, NULL};
    assert_int_equal(sb_test_run_cli(bad, &out, &err), 1);
    assert_non_null(strstr(err, "bad.jinja:2:13: no filter named 'nosuch'"));
    free(out);
    free(err);
    const char *usage[] = {"template", "--messages", msg_path, NULL};
    assert_int_equal(sb_test_run_cli(usage, &out, &err), 2);
    free(out);
    free(err);
    free(msg_path);
    free(bad_path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expected_jsonl),
        cmocka_unit_test(test_semantics),
        cmocka_unit_test(test_kwargs_and_paths),
        cmocka_unit_test(test_builtins_match_fixtures),
        cmocka_unit_test(test_skipped_cases_raise),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_parse_once_render_many),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, load_expected, free_expected);
}
