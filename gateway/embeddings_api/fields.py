"""What the embeddings API does with each request field (`gateway.http.fields`): all are acted on."""

from __future__ import annotations

from gateway.embeddings_api.schemas import EmbeddingsRequest
from gateway.http.fields import FieldTable

EMBEDDINGS_FIELDS = FieldTable(api="embeddings", struct=EmbeddingsRequest)
