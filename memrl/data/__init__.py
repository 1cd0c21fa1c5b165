"""Read every supported file format into validated records."""

from memrl.data.records import Document, QARecord, render_documents

__all__ = ["Document", "QARecord", "render_documents"]
