#!/bin/bash
echo river > /workspace/list.txt
