"""memrl.memory: namespaced memory store, embedders, and the memory tools the agent calls.

`MemoryStore` keeps one memory per namespace (a base per conversation, a cheap fork per
rollout), in process or, as `RayMemoryStore`, in one Ray actor shared by rollout workers;
`Embedder` turns texts into unit vectors for its cosine search; `TOOLS`, `parse_tool_calls`
and `execute_tool_call` connect model output to the store.
"""

from memrl.memory.embedder import (
    Embedder,
    HashingEmbedder,
    MiniLMEmbedder,
    default_embedder,
    l2_normalize,
)
from memrl.memory.ray_store import MemoryStoreManager, RayMemoryStore
from memrl.memory.store import (
    MemoryBackend,
    MemoryRecord,
    MemoryStore,
    MemoryStoreError,
    validate_namespace,
)
from memrl.memory.tools import (
    TOOL_NAMES,
    TOOLS,
    ToolCall,
    ToolParseResult,
    ToolResult,
    execute_tool_call,
    format_tool_response,
    parse_tool_calls,
    tools_prompt,
    validate_arguments,
)

__all__ = [
    "TOOLS",
    "TOOL_NAMES",
    "Embedder",
    "HashingEmbedder",
    "MemoryBackend",
    "MemoryRecord",
    "MemoryStore",
    "MemoryStoreError",
    "MemoryStoreManager",
    "MiniLMEmbedder",
    "RayMemoryStore",
    "ToolCall",
    "ToolParseResult",
    "ToolResult",
    "default_embedder",
    "execute_tool_call",
    "format_tool_response",
    "l2_normalize",
    "parse_tool_calls",
    "tools_prompt",
    "validate_arguments",
    "validate_namespace",
]
