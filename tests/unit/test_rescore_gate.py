"""The re-scoring gate (endpoint/rescore.py) on an engine that must re-score alone
(vLLM on a CPU): no re-scoring runs beside a chat or beside another re-scoring, and the
re-scorings of a wave of chats that end together share one pause of the chats instead
of letting a new chat in between each two (which made a step's rollouts crawl in waves).
Plain asyncio: the gate is all there is to it.
"""

import asyncio

from rlcoach.endpoint.rescore import RescoreGate


def test_a_waves_rescorings_share_one_pause_and_never_overlap_a_chat_or_each_other():
    events: list[str] = []

    async def main() -> None:
        gate = RescoreGate(enabled=True)
        state = {"chats": 0, "rescoring": 0}

        async def chat(name: str, seconds: float) -> None:
            await gate.enter()
            state["chats"] += 1
            events.append(f"chat {name}")
            await asyncio.sleep(seconds)
            state["chats"] -= 1
            await gate.leave()

        async def forced_reply(name: str, seconds: float) -> None:
            # A constrained chat: generated, then re-scored (rescored_choices' order),
            # then the rollout's next chat.
            await gate.enter()
            state["chats"] += 1
            await asyncio.sleep(seconds)
            state["chats"] -= 1
            await gate.leave()
            async with gate.alone():
                assert state["chats"] == 0 and state["rescoring"] == 0
                state["rescoring"] += 1
                events.append(f"rescore {name}")
                await asyncio.sleep(0.01)
                state["rescoring"] -= 1
            await chat(f"{name}-next", 0.01)

        await asyncio.gather(*(forced_reply(str(i), 0.01 * (i + 1)) for i in range(4)))

    asyncio.run(main())
    rescorings = [i for i, event in enumerate(events) if event.startswith("rescore")]
    assert len(rescorings) == 4
    # One pause: the four re-scorings follow each other with no chat between them.
    assert rescorings == list(range(rescorings[0], rescorings[0] + 4)), events
    assert sorted(events[rescorings[-1] + 1 :]) == [f"chat {i}-next" for i in range(4)]


def test_a_gate_that_is_off_lets_everything_through_at_once():
    async def main() -> int:
        gate = RescoreGate(enabled=False)
        await gate.enter()
        async with gate.alone():  # a chat still in flight: no wait
            return 1

    assert asyncio.run(main()) == 1
