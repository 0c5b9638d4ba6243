"""mgmt_rule.py the SDK's asyncio way: create (with a parametrized SQL filter), list, get and
update, and delete a subscription's rules through ``poisonq.servicebus.aio.management``.

Follows the flow of azure-sdk-for-python's samples/async_samples/mgmt_rule_async.py, written
anew in the SDK's idiom; only the import lines and the connection string differ.
"""

import asyncio
import os
import uuid

from poisonq.servicebus.aio.management import ServiceBusAdministrationClient
from poisonq.servicebus.management import SqlRuleFilter

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
TOPIC_NAME = os.environ["SERVICEBUS_TOPIC_NAME"]
SUBSCRIPTION_NAME = os.environ["SERVICEBUS_SUBSCRIPTION_NAME"]
RULE_NAME = "sb_mgmt_rule" + str(uuid.uuid4())
RULE_WITH_SQL_FILTER_NAME = "sb_sql_rule" + str(uuid.uuid4())


async def create_rule(servicebus_mgmt_client):
    print("-- Create Rule")
    await servicebus_mgmt_client.create_rule(TOPIC_NAME, SUBSCRIPTION_NAME, RULE_NAME)
    print(f"Rule {RULE_NAME} is created.")
    sql_filter_parametrized = SqlRuleFilter(
        "property1 = @param1 AND property2 = @param2",
        parameters={"@param1": "value", "@param2": 1},
    )
    await servicebus_mgmt_client.create_rule(
        TOPIC_NAME, SUBSCRIPTION_NAME, RULE_WITH_SQL_FILTER_NAME, filter=sql_filter_parametrized
    )
    print(f"Rule {RULE_WITH_SQL_FILTER_NAME} is created.")


async def delete_rule(servicebus_mgmt_client):
    print("-- Delete Rule")
    await servicebus_mgmt_client.delete_rule(TOPIC_NAME, SUBSCRIPTION_NAME, RULE_NAME)
    await servicebus_mgmt_client.delete_rule(
        TOPIC_NAME, SUBSCRIPTION_NAME, RULE_WITH_SQL_FILTER_NAME
    )


async def list_rules(servicebus_mgmt_client):
    print("-- List Rules")
    async for rule_properties in servicebus_mgmt_client.list_rules(TOPIC_NAME, SUBSCRIPTION_NAME):
        print("Rule Name:", rule_properties.name)


async def get_and_update_rule(servicebus_mgmt_client):
    print("-- Get and Update Rule")
    rule_properties = await servicebus_mgmt_client.get_rule(
        TOPIC_NAME, SUBSCRIPTION_NAME, RULE_NAME
    )
    print("Rule Name:", rule_properties.name)
    rule_properties.filter = SqlRuleFilter(
        "property1 = @param1 AND property2 = @param2",
        parameters={"@param1": "value2", "@param2": 2},
    )
    await servicebus_mgmt_client.update_rule(TOPIC_NAME, SUBSCRIPTION_NAME, rule_properties)

    rule_properties = await servicebus_mgmt_client.get_rule(
        TOPIC_NAME, SUBSCRIPTION_NAME, RULE_NAME
    )
    await servicebus_mgmt_client.update_rule(
        TOPIC_NAME,
        SUBSCRIPTION_NAME,
        rule_properties,
        filter=SqlRuleFilter(
            "property1 = @param1 AND property2 = @param2",
            parameters={"@param1": "value3", "@param2": 3},
        ),
    )


async def main():
    async with ServiceBusAdministrationClient.from_connection_string(
        CONNECTION_STR
    ) as servicebus_mgmt_client:
        await create_rule(servicebus_mgmt_client)
        await list_rules(servicebus_mgmt_client)
        await get_and_update_rule(servicebus_mgmt_client)
        rule = await servicebus_mgmt_client.get_rule(TOPIC_NAME, SUBSCRIPTION_NAME, RULE_NAME)
        assert rule.filter.sql_expression == "property1 = 'value3' AND property2 = 3"
        await delete_rule(servicebus_mgmt_client)


asyncio.run(main())
