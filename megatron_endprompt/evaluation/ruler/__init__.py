"""RULER: the task definitions (``spec``), their sources (``sources``: haystacks, word lists),
the NIAH/VT and CWE/FWE renderers (``niah``, ``aggregate``), fitting a prompt to a length
(``synthetic``), qa_1/qa_2 from local files (``qa``), and the rows they give the task table
(``tasks``)."""
