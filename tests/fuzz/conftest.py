"""The fuzz suite (hypothesis): every parser and loader at a trust boundary, fed hostile
input, either succeeds or fails with the project's one error class for it — never another
exception, never unbounded work. Each target runs a bounded number of examples
(``deadline=None``: timing is not what is tested), so the whole suite takes seconds.
Shared strategies are in ``fuzz_json.py``."""
