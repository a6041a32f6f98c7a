"""The edge's OpenAPI 3.1 document (``/openapi.json``) and the ``/docs``
page that renders it: the schemas, and the paths of each API family."""
