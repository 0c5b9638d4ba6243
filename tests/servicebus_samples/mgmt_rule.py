"""Managing a subscription's rules: create (with a parametrized SQL filter), list, get and
update, delete.

Follows the flow of azure-sdk-for-python's samples/sync_samples/mgmt_rule.py, written anew
in the SDK's idiom; only the import line and the connection string differ.
"""

import os
import uuid

from poisonq.servicebus.management import ServiceBusAdministrationClient, SqlRuleFilter

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
TOPIC_NAME = os.environ["SERVICEBUS_TOPIC_NAME"]
SUBSCRIPTION_NAME = os.environ["SERVICEBUS_SUBSCRIPTION_NAME"]
RULE_NAME = "sb_mgmt_rule" + str(uuid.uuid4())
RULE_WITH_SQL_FILTER_NAME = "sb_sql_rule" + str(uuid.uuid4())


def create_rule(servicebus_mgmt_client):
    servicebus_mgmt_client.create_rule(TOPIC_NAME, SUBSCRIPTION_NAME, RULE_NAME)
    sql_filter_parametrized = SqlRuleFilter(
        "property1 = @param1 AND property2 = @param2",
        parameters={"@param1": "value", "@param2": 1},
    )
    servicebus_mgmt_client.create_rule(
        TOPIC_NAME, SUBSCRIPTION_NAME, RULE_WITH_SQL_FILTER_NAME, filter=sql_filter_parametrized
    )


def list_rules(servicebus_mgmt_client):
    for rule_properties in servicebus_mgmt_client.list_rules(TOPIC_NAME, SUBSCRIPTION_NAME):
        print("Rule Name:", rule_properties.name)


def get_and_update_rule(servicebus_mgmt_client):
    rule_properties = servicebus_mgmt_client.get_rule(TOPIC_NAME, SUBSCRIPTION_NAME, RULE_NAME)
    rule_properties.filter = SqlRuleFilter(
        "property1 = @param1 AND property2 = @param2",
        parameters={"@param1": "value2", "@param2": 2},
    )
    servicebus_mgmt_client.update_rule(TOPIC_NAME, SUBSCRIPTION_NAME, rule_properties)

    rule_properties = servicebus_mgmt_client.get_rule(TOPIC_NAME, SUBSCRIPTION_NAME, RULE_NAME)
    servicebus_mgmt_client.update_rule(
        TOPIC_NAME,
        SUBSCRIPTION_NAME,
        rule_properties,
        filter=SqlRuleFilter(
            "property1 = @param1 AND property2 = @param2",
            parameters={"@param1": "value3", "@param2": 3},
        ),
    )


def delete_rule(servicebus_mgmt_client):
    servicebus_mgmt_client.delete_rule(TOPIC_NAME, SUBSCRIPTION_NAME, RULE_NAME)
    servicebus_mgmt_client.delete_rule(TOPIC_NAME, SUBSCRIPTION_NAME, RULE_WITH_SQL_FILTER_NAME)


with ServiceBusAdministrationClient.from_connection_string(
    CONNECTION_STR
) as servicebus_mgmt_client:
    create_rule(servicebus_mgmt_client)
    list_rules(servicebus_mgmt_client)
    get_and_update_rule(servicebus_mgmt_client)
    rule = servicebus_mgmt_client.get_rule(TOPIC_NAME, SUBSCRIPTION_NAME, RULE_NAME)
    assert rule.filter.sql_expression == "property1 = 'value3' AND property2 = 3"
    delete_rule(servicebus_mgmt_client)
