"""Which recorded conversation is the main history (rlcoach.trajectory.histories's rule).

The exchanges are shaped exactly as the policy endpoint records them: the client's
request body and the completion with its token ids and log-probs."""

import json

from rlcoach.trajectory.exchange import Exchange
from rlcoach.trajectory.histories import assemble_histories
from rlcoach.trajectory.trajectories import CHOICE_KEY

ROUTER = {"role": "system", "content": "Route shop questions to 'shop'."}
AGENT = {"role": "system", "content": "You are the shop assistant."}
USER = {"role": "user", "content": "How much is the kettle?"}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "lookup_price", "arguments": '{"product": "kettle"}'},
}
TOOL = {"role": "tool", "tool_call_id": "call_1", "content": "24.50 EUR"}


def exchange(messages, reply, constraint=None):
    choice = {
        "index": 0,
        "message": {"role": "assistant", **reply},
        "finish_reason": "stop",
        "token_ids": [5, 6],
        "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}]},
    }
    if constraint:
        choice[CHOICE_KEY] = {"forced": [1], "constraint": constraint}
    response = {"model": "p@0", "prompt_token_ids": [1, 2, 3], "choices": [choice]}
    return Exchange.recorded({"messages": messages}, response)


def the_app(summary_last=True):
    """A router (JSON schema), a one-call ReAct agent, a summariser: three histories of
    one call each."""
    route = exchange([ROUTER, USER], {"content": json.dumps({"destination": "shop"})}, "json")
    answer = {"content": "The kettle costs 24.50 EUR."}
    react = exchange([AGENT, USER], answer)
    summary = exchange([{"role": "user", "content": "Summarise: kettle"}], {"content": "Kettle."})
    return [route, react, summary] if summary_last else [route, summary, react]


def test_the_graph_final_state_picks_the_conversation_it_continues():
    final = [USER, {"role": "assistant", "content": "The kettle costs 24.50 EUR."}]
    main, others = assemble_histories(the_app(), final)
    assert main.messages[0] == AGENT and main.messages[-1]["content"].startswith("The kettle")
    assert len(others) == 2


def test_without_a_final_state_the_last_free_reply_wins_never_a_constrained_one():
    main, _ = assemble_histories(the_app(summary_last=False))
    assert main.messages[0] == AGENT  # the last call
    route, react, _ = the_app()
    main, _ = assemble_histories([react, route])  # the router answered last: constrained
    assert main.messages[0] == AGENT
    main, others = assemble_histories([route])  # alone, it is still the main one
    assert main.messages[0] == ROUTER and others == []


def test_a_multi_turn_conversation_stays_one_history_and_wins_over_a_later_helper():
    first = exchange([AGENT, USER], {"content": None, "tool_calls": [CALL]})
    # the client sends the reply back its own way: content "" and the call re-serialised
    echoed = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    second = exchange([AGENT, USER, echoed, TOOL], {"content": "24.50 EUR."})
    helper = exchange([{"role": "user", "content": "Rate this."}], {"content": "9"}, "regex")
    main, others = assemble_histories([first, second, helper])
    assert len(main.choices) == 2 and main.messages[-1]["content"] == "24.50 EUR."
    assert [h.choices[0].constraint for h in others] == ["regex"]
    assert others[0].choices[0].forced == [1]
