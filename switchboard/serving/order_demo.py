"""The demo's order service: three tools a customer-service agent calls, and a fake backend that
answers them the same way every time for the same order.

The default model is trained on conversations that call these tools (corpus/tools.jsonl, whose
results have the shapes ``call`` returns), the web chat offers them with the "order tools"
switch and runs the calls here through the gateway, and the tool benchmark
(``python -m switchboard.evaluation.tools``) scores how often the model picks the right one.
"""

from __future__ import annotations

import re

ORDER_ID = {"type": "string", "pattern": "^SB[0-9]{8}$", "description": "the order number, SB and 8 digits"}
RETURN_REASONS = ["damaged", "wrong_item", "wrong_size", "changed_mind"]
HANDOVER_REASONS = ["customer_request", "complaint"]

# OpenAI's tool definitions (properties in the order the model writes them).
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_status",
            "description": "Look up an order: processing, shipped (with the days until delivery) or delivered.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": ORDER_ID},
                "required": ["order_id"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "start_return",
            "description": "Start a return and refund for an order.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": ORDER_ID, "reason": {"type": "string", "enum": RETURN_REASONS}},
                "required": ["order_id", "reason"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "transfer_to_human",
            "description": "Hand the chat over to a person on the support team.",
            "parameters": {
                "type": "object",
                "properties": {"reason": {"type": "string", "enum": HANDOVER_REASONS}},
                "required": ["reason"],
                "additionalProperties": False,
            },
        },
    },
]
NAMES = tuple(t["function"]["name"] for t in TOOLS)
_ORDER = re.compile(r"^SB[0-9]{8}$")


def call(name: str, arguments: dict) -> dict:
    """The fake service's answer to one call (what a real backend would return, as JSON)."""
    if name == "transfer_to_human":
        return {"transferred": True, "wait_minutes": 3}
    order_id = arguments.get("order_id") if isinstance(arguments, dict) else None
    if not isinstance(order_id, str) or not _ORDER.match(order_id):
        return {"error": "order not found"}
    if name == "start_return":
        return {"order_id": order_id, "return_started": True, "refund_days": 5}
    if name != "get_order_status":
        return {"error": f"unknown tool {name[:64]}"}
    last = int(order_id[-1])
    if last < 4:
        return {"order_id": order_id, "status": "processing"}
    if last < 8:
        return {"order_id": order_id, "status": "shipped", "eta_days": 1 + last % 4}
    return {"order_id": order_id, "status": "delivered"}
